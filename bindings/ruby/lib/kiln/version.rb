# frozen_string_literal: true

module Kiln
  # The gem's version (Kiln::LIBRARY_VERSION is the libkiln it was built against).
  VERSION = "0.1.0"
end
