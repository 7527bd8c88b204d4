# frozen_string_literal: true

require_relative "lib/kiln/version"

Gem::Specification.new do |spec|
  spec.name = "kiln"
  spec.version = Kiln::VERSION
  spec.summary = "Ruby bindings for Kiln, a tensor runtime with lazy tracing, a JIT and autodiff"
  spec.description = <<~DESC
    Kiln::Tensor over libkiln: eager-looking tensor code whose ops are recorded
    lazily, keyed, cached and fused; reverse-mode autodiff; PyTorch-style
    printing.  Needs an installed libkiln (found with pkg-config, or
    gem install kiln -- --with-kiln-dir=PREFIX).
  DESC
  spec.authors = ["The Kiln authors"]
  # Apache-2.0 (LICENSE at the repository root).  No homepage or
  # metadata["source_code_uri"] yet: set them when there is a public address.
  spec.license = "Apache-2.0"
  spec.required_ruby_version = ">= 3.0"

  spec.files = Dir["lib/**/*.rb", "ext/kiln/*.{c,h,rb}", "test/**/*.rb", "README.md",
                   "Rakefile", "kiln.gemspec"]
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/kiln/extconf.rb"]

  spec.add_development_dependency "minitest", "~> 5.0"
  spec.add_development_dependency "rake", "~> 13.0"
  spec.add_development_dependency "rake-compiler", "~> 1.0"
end
