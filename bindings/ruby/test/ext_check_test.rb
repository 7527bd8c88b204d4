# frozen_string_literal: true

require_relative "test_helper"
require "tmpdir"
require "fileutils"
require "open3"
require "rbconfig"

# A kiln_ext.so older than the extension's sources next to it (a stale build
# left in lib/kiln of a checkout) refuses to load (issue 17, item 5).
class ExtCheckTest < Minitest::Test
  GEM = File.expand_path("..", __dir__)

  def load_from(dir, env = {})
    Open3.capture2e(env, RbConfig.ruby, "-I", File.join(dir, "lib"), "-e", 'require "kiln"; print Kiln::VERSION')
  end

  def test_a_stale_extension_raises_load_error
    so = Dir[File.join(GEM, "lib", "kiln", "kiln_ext.*")].first
    skip "no compiled extension" unless so
    Dir.mktmpdir do |dir|
      FileUtils.cp_r(File.join(GEM, "lib"), dir)
      FileUtils.mkdir_p(File.join(dir, "ext"))
      FileUtils.cp_r(File.join(GEM, "ext", "kiln"), File.join(dir, "ext"))
      copy = File.join(dir, "lib", "kiln", File.basename(so))
      old = Time.now - 3600
      File.utime(old, old, copy)
      Dir[File.join(dir, "ext", "kiln", "*")].each { |f| File.utime(old - 60, old - 60, f) }
      out, st = load_from(dir)
      assert st.success?, out
      FileUtils.touch(File.join(dir, "ext", "kiln", "ops.c"))
      out, st = load_from(dir)
      refute st.success?
      assert_match(/LoadError/, out)
      assert_match(/older than ops\.c.*rake compile/, out)
      out, st = load_from(dir, "KILN_ALLOW_STALE_EXT" => "1")
      assert st.success?, out
    end
  end
end
