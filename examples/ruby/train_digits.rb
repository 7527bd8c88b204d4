# frozen_string_literal: true

# train_digits.rb — a 64-64-10 MLP on handwritten digits, trained from Ruby
# with Kiln's autodiff and plain SGD.
#
#   ruby -Ibindings/ruby/lib examples/ruby/train_digits.rb   # from the repo, after
#   (cd bindings/ruby && rake compile)                       # or with the gem installed
#
# Data: data/digits.csv.gz — Optical Recognition of Handwritten Digits,
# E. Alpaydin and C. Kaynak, UCI Machine Learning Repository (1998), CC BY 4.0.
require "kiln"
require "zlib"

path = ARGV[0] || File.expand_path("../../data/digits.csv.gz", __dir__)
rows = Zlib::GzipReader.open(path) { |gz| gz.each_line.map { |l| l.split(",").map(&:to_i) } }
rng = Random.new(20_240_601)
perm = (0...rows.size).to_a.shuffle(random: rng)
ntrain = rows.size * 4 / 5
images = ->(ids) { Kiln.tensor(ids.map { |i| rows[i][0, 64].map { |v| v / 16.0 } }) }
labels = ->(ids) { Kiln.tensor(ids.map { |i| rows[i][64] }) }
xtr, ytr = images.(perm[0...ntrain]), labels.(perm[0...ntrain])
xte, yte = images.(perm[ntrain..]), labels.(perm[ntrain..])

Kiln.manual_seed(0)
w1 = (Kiln.randn(64, 64) * Math.sqrt(2.0 / 64)).detach.requires_grad!
b1 = Kiln.zeros(64, requires_grad: true)
w2 = (Kiln.randn(64, 10) * Math.sqrt(2.0 / 64)).detach.requires_grad!
b2 = Kiln.zeros(10, requires_grad: true)
params = [w1, b1, w2, b2]
model = ->(x) { (x.matmul(w1) + b1).relu.matmul(w2) + b2 }

batch, lr = 32, 0.3
puts "#{rows.size} images (#{ntrain} train), model 64-64-10, batch #{batch}, lr #{lr}"
t0 = Time.now
40.times do |epoch|
  order = (0...ntrain).to_a.shuffle(random: rng)
  total = 0.0
  order.each_slice(batch) do |ids|
    idx = Kiln.tensor(ids)
    loss = Kiln.cross_entropy(model.(xtr[idx]), ytr[idx])
    loss.backward
    Kiln.no_grad do
      params.each { |p| p.sub_scaled!(p.grad, lr).zero_grad! }
    end
    total += loss.item * ids.size
  end
  next unless (epoch + 1) % 10 == 0

  acc = Kiln.no_grad { model.(xte).argmax(dim: 1).eq(yte).float.mean.item }
  printf("epoch %2d  loss %.4f  test accuracy %.2f%%\n", epoch + 1, total / ntrain, 100 * acc)
end
s = Kiln.stats
printf("%.2f s; Kiln: %d ops recorded, %d flushes, trace cache hits %d of %d\n",
       Time.now - t0, s[:ops_recorded], s[:flushes], s[:cache_hits], s[:cache_hits] + s[:cache_misses])
