# frozen_string_literal: true

require_relative "lib/kiln/version"
require "fileutils"

# The gem carries Kiln's C sources (vendor/kiln), so `gem install` builds
# libkiln and its compiler helper itself when no installed Kiln is found
# (ext/kiln/extconf.rb).  Built inside the repository, the gemspec copies
# them afresh from it; loaded anywhere else it packs what vendor/ holds.
KILN_VENDORED = %w[CMakeLists.txt LICENSE cmake autodiff bindings/c cache front jit_cpu jit_gpu
                   trace vm].freeze
repo = File.expand_path("../..", __dir__)
vendor = File.join(__dir__, "vendor", "kiln")
if File.exist?(File.join(repo, "vm", "ops.def")) && File.exist?(File.join(repo, "CMakeLists.txt"))
  FileUtils.rm_rf(vendor)
  KILN_VENDORED.each do |path|
    FileUtils.mkdir_p(File.dirname(File.join(vendor, path)))
    FileUtils.cp_r(File.join(repo, path), File.join(vendor, path))
  end
end

Gem::Specification.new do |spec|
  spec.name = "kiln"
  spec.version = Kiln::VERSION
  spec.summary = "Ruby bindings for Kiln, a tensor runtime with lazy tracing, a JIT and autodiff"
  spec.description = <<~DESC
    Kiln::Tensor over libkiln: eager-looking tensor code whose ops are recorded
    lazily, keyed, cached and fused; reverse-mode autodiff; PyTorch-style
    printing.  Builds libkiln from the sources it carries (needs cmake, a C
    compiler, libgccjit, OpenBLAS, xxHash and uthash), or links an installed
    Kiln (pkg-config, or gem install kiln -- --with-kiln-dir=PREFIX).
  DESC
  spec.authors = ["The Kiln authors"]
  # Apache-2.0 (LICENSE at the repository root).  No homepage or
  # metadata["source_code_uri"] yet: set them when there is a public address.
  spec.license = "Apache-2.0"
  spec.required_ruby_version = ">= 3.0"

  spec.files = Dir["lib/**/*.rb", "ext/kiln/*.{c,h,rb}", "test/**/*.rb", "README.md",
                   "Rakefile", "kiln.gemspec"] +
               Dir.glob("vendor/kiln/**/*", File::FNM_DOTMATCH, base: __dir__).select do |f|
                 File.file?(File.join(__dir__, f))
               end
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/kiln/extconf.rb"]

  spec.add_development_dependency "minitest", "~> 5.0"
  spec.add_development_dependency "rake", "~> 13.0"
  spec.add_development_dependency "rake-compiler", "~> 1.0"
end
