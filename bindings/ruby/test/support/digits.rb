# frozen_string_literal: true

require "zlib"

# The digits data set (data/digits.csv.gz: Optical Recognition of Handwritten
# Digits, E. Alpaydin and C. Kaynak, UCI Machine Learning Repository, 1998,
# CC BY 4.0; see data/README.md) and a fixed 80/20 split, shuffled like
# examples/mlp_digits.c (splitmix64 Fisher-Yates, seed 20240601).
module Digits
  PATH = ENV.fetch("KILN_DIGITS", File.expand_path("../../../../data/digits.csv.gz", __dir__))
  MASK = (1 << 64) - 1

  def self.available?
    File.exist?(PATH)
  end

  # [[64 pixels / 16.0], ...] and [label, ...]
  def self.load
    rows = Zlib::GzipReader.open(PATH) { |gz| gz.each_line.reject { |l| l.strip.empty? }.map { |l| l.split(",").map(&:to_i) } }
    [rows.map { |r| r[0, 64].map { |v| v / 16.0 } }, rows.map { |r| r[64] }]
  end

  # a splitmix64 generator: the same numbers on every Ruby
  class Rng
    def initialize(seed)
      @s = seed & MASK
    end

    def next
      @s = (@s + 0x9e3779b97f4a7c15) & MASK
      z = @s
      z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK
      z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK
      z ^ (z >> 31)
    end

    def shuffle!(a)
      (a.size - 1).downto(1) do |i|
        j = self.next % (i + 1)
        a[i], a[j] = a[j], a[i]
      end
      a
    end
  end

  # Kiln tensors xtr [n,64] f32, ytr [n] i64, xte, yte
  def self.split
    x, y = load
    perm = Rng.new(20_240_601).shuffle!((0...x.size).to_a)
    ntrain = x.size * 4 / 5
    tr = perm[0...ntrain]
    te = perm[ntrain..]
    [Kiln.tensor(x.values_at(*tr)), Kiln.tensor(y.values_at(*tr)),
     Kiln.tensor(x.values_at(*te)), Kiln.tensor(y.values_at(*te))]
  end
end
