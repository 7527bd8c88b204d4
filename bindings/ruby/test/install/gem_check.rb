# frozen_string_literal: true

# gem_check.rb — run by scripts/test after `gem install` of a freshly built
# kiln-*.gem into an empty GEM_HOME, with no Kiln on the system paths: the
# gem loads from GEM_HOME (never the repository), with the libkiln its
# extconf built from the sources it carries, and the JIT compiles kernels
# with the kiln-jitc inside the gem (KILN_JITC unset: found by libkiln).
require "kiln"
spec = Gem.loaded_specs["kiln"]
abort "kiln was not loaded from an installed gem" unless spec
ext = $LOADED_FEATURES.grep(/kiln_ext/).first.to_s
abort "kiln_ext loaded from #{ext}, not from #{spec.gem_dir}" unless ext.start_with?(spec.gem_dir)
p Kiln.randn(2, 2)
x = Kiln.randn(64, 64)
10.times { (x * 2.0 + 1.0).tanh.sum.item }
Kiln.jit_wait if Kiln.respond_to?(:jit_wait)
10.times { (x * 2.0 + 1.0).tanh.sum.item }
s = Kiln.stats
puts "compiles=#{s[:compiles]} failures=#{s[:compile_failures]} compiler_processes=#{s[:compiler_processes]}"
abort "the JIT compiled nothing outside the process" unless s[:compiles] > 0 && s[:compile_failures] == 0 && s[:compiler_processes] > 0
