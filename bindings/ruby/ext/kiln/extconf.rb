# frozen_string_literal: true

# extconf.rb — finds libkiln and kiln.h, in this order:
#   1. --with-kiln-dir=PREFIX (or --with-kiln-include / --with-kiln-lib), via dir_config;
#   2. pkg-config kiln (an installed Kiln: `cmake --install build/release --prefix P`
#      and PKG_CONFIG_PATH=P/lib/pkgconfig);
#   3. the in-repo build: ../../build/release and ../../bindings/c/include,
#      relative to the gem directory (bindings/ruby);
#   4. the sources the gem carries (vendor/kiln, packed by kiln.gemspec): built
#      with CMake into vendor/prefix inside the installed gem, libkiln and its
#      compiler helper kiln-jitc (found by libkiln at <libdir>/../libexec/kiln,
#      under the trust rules of DESIGN §11).  So `gem install kiln` needs no
#      Kiln installed first: only the build packages.
# The library directory found is added as an rpath, so the extension loads
# libkiln.so without LD_LIBRARY_PATH.
require "etc"
require "fileutils"
require "mkmf"

def kiln_abort(msg)
  abort <<~MSG

    kiln: #{msg}
      Build Kiln first (cd KILN_REPO && source scripts/setup.sh &&
      kiln_build build/release -DCMAKE_BUILD_TYPE=Release), then either
        - install it (cmake --install build/release --prefix P) and set
          PKG_CONFIG_PATH=P/lib/pkgconfig, or
        - pass --with-kiln-dir=P (gem install kiln -- --with-kiln-dir=P), or
        - build the gem inside the Kiln repository (bindings/ruby).
    See mkmf.log for the compiler's output.
  MSG
end

gem_dir = File.expand_path("../..", __dir__) # bindings/ruby
repo_dir = File.expand_path("../..", gem_dir)
lib_dirs = []
inc_dirs = []

# 1. --with-kiln-dir / --with-kiln-include / --with-kiln-lib
inc, lib = dir_config("kiln")
source = nil
if inc || lib
  source = "--with-kiln-dir (or --with-kiln-include / --with-kiln-lib)"
  inc_dirs << inc if inc
  if lib
    lib_dirs.concat(lib.split(File::PATH_SEPARATOR))
    # dir_config's default is PREFIX/lib; CMake may also install to lib64 or a multiarch dir
    base = File.dirname(lib.split(File::PATH_SEPARATOR).first)
    %w[lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu].each do |d|
      dir = File.join(base, d)
      next unless File.exist?(File.join(dir, "libkiln.so")) && !lib_dirs.include?(dir)
      lib_dirs << dir
      $LIBPATH |= [dir]
    end
  end
end

# 2. pkg-config
if source.nil? && find_executable("pkg-config") && (flags = pkg_config("kiln"))
  source = "pkg-config"
  libdir = `pkg-config --variable=libdir kiln`.strip
  lib_dirs << File.expand_path(libdir) unless libdir.empty?
  incdir = `pkg-config --variable=includedir kiln`.strip
  inc_dirs << File.expand_path(incdir) unless incdir.empty?
end

# 3. the in-repo build
if source.nil?
  build = File.join(repo_dir, "build", "release")
  header_dir = File.join(repo_dir, "bindings", "c", "include")
  if File.exist?(File.join(header_dir, "kiln.h"))
    source = "the Kiln repository (#{repo_dir})"
    inc_dirs << header_dir
    lib_dirs << build
    $INCFLAGS << " -I#{header_dir}"
    $LIBPATH |= [build]
  end
end

# 4. the sources the gem carries
vendor = File.join(gem_dir, "vendor", "kiln")
if source.nil? && File.exist?(File.join(vendor, "CMakeLists.txt"))
  packages = "Debian: apt-get install cmake build-essential pkg-config libgccjit-12-dev " \
             "libopenblas-dev libxxhash-dev uthash-dev"
  cmake = find_executable("cmake")
  kiln_abort("building Kiln from the sources this gem carries needs CMake (#{packages})") unless cmake
  build = File.join(gem_dir, "vendor", "build")
  prefix = File.join(gem_dir, "vendor", "prefix")
  jobs = ENV.fetch("KILN_JOBS") { Etc.nprocessors.to_s }
  message "kiln: building Kiln from its sources into #{prefix} (#{jobs} jobs)\n"
  built = system(cmake, "-S", vendor, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                 "-DKILN_BUILD_TESTS=OFF", "-DKILN_BUILD_EXAMPLES=OFF", "-DKILN_BUILD_PERF=OFF",
                 "-DCMAKE_INSTALL_PREFIX=#{prefix}", "-DCMAKE_INSTALL_LIBDIR=lib") &&
          system(cmake, "--build", build, "-j", jobs) &&
          system(cmake, "--install", build)
  kiln_abort("building Kiln from the sources this gem carries failed: see CMake's messages above (#{packages})") unless built
  FileUtils.rm_rf(build) # the objects: libkiln, kiln.h and kiln-jitc are in prefix
  source = "the sources this gem carries (built into #{prefix})"
  inc_dirs << File.join(prefix, "include")
  lib_dirs << File.join(prefix, "lib")
  $INCFLAGS << " -I#{File.join(prefix, 'include')}"
  $LIBPATH |= [File.join(prefix, "lib")]
end

kiln_abort("cannot find Kiln (no --with-kiln-dir, no `pkg-config kiln`, not inside the repository, no sources in the gem)") if source.nil?
message "kiln: using Kiln from #{source}\n"

unless find_header("kiln.h", *inc_dirs)
  kiln_abort("kiln.h not found (looked in #{inc_dirs.empty? ? 'the default paths' : inc_dirs.join(', ')})")
end
unless have_library("kiln", "kiln_version", "kiln.h")
  kiln_abort("libkiln not found or not linkable (looked in #{lib_dirs.empty? ? 'the default paths' : lib_dirs.join(', ')})")
end
unless have_header("ruby/thread.h") && have_func("rb_thread_call_without_gvl", "ruby/thread.h")
  kiln_abort("this Ruby lacks rb_thread_call_without_gvl (Ruby >= 2.0 is needed)")
end
have_func("open_memstream", "stdio.h") || kiln_abort("open_memstream is missing from the C library")

lib_dirs.uniq.each do |dir|
  $LDFLAGS << " -Wl,-rpath,#{dir}" if File.directory?(dir)
end

$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers"
$CFLAGS << " -Werror" if ENV["KILN_RUBY_WERROR"] == "1"

create_makefile("kiln/kiln_ext")
