# frozen_string_literal: true

# Kiln: a tensor runtime with lazy tracing and autodiff.  `require "kiln"`.
#
#   x = Kiln.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad: true)
#   y = (x * 2 + 1).tanh.sum
#   y.backward
#   x.grad   # => Kiln::Tensor
#
# Ops record lazily; reading a value (to_a, item, inspect) or Kiln.sync
# evaluates.  The C extension (kiln/kiln_ext) wraps libkiln; the files below
# add keyword arguments and the Ruby conveniences.
require_relative "kiln/version"
require "kiln/kiln_ext"
require_relative "kiln/ext_check"
require_relative "kiln/errors"
require_relative "kiln/signature"
require_relative "kiln/scalar"
require_relative "kiln/tensor"
require_relative "kiln/functions"
require_relative "kiln/tensor_more"
require_relative "kiln/nn"
require_relative "kiln/nn_more"
require_relative "kiln/nn_extra"
require_relative "kiln/optim"
require_relative "kiln/amp"
require_relative "kiln/data"
require_relative "kiln/distributed"
