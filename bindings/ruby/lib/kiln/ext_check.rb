# frozen_string_literal: true

module Kiln
  # A lib/kiln/kiln_ext.so left in a checkout by an earlier `rake compile`
  # wins over an installed gem for any script that puts this lib/ first
  # (perf/w9_ruby.rb does).  When the extension's sources sit next to the
  # loaded library (a checkout), a source newer than the library means it is
  # stale: that raises LoadError instead of running old code.
  # KILN_ALLOW_STALE_EXT=1 turns the check off.
  module ExtCheck
    def self.check!
      return if ENV["KILN_ALLOW_STALE_EXT"] == "1"

      so = $LOADED_FEATURES.grep(%r{/kiln/kiln_ext\.(so|bundle|dll)\z}).last
      return if so.nil? || !File.exist?(so)

      src = File.expand_path("../../ext/kiln", File.dirname(so))
      sources = Dir[File.join(src, "*.{c,h}")]
      return if sources.empty?

      built = File.mtime(so)
      newer = sources.select { |f| File.mtime(f) > built }
      return if newer.empty?

      raise LoadError, "#{so} is older than #{newer.map { |f| File.basename(f) }.join(', ')} in #{src}: " \
                       "run `rake compile` in bindings/ruby, or remove it (KILN_ALLOW_STALE_EXT=1 loads it anyway)"
    end
  end
  ExtCheck.check!
end
