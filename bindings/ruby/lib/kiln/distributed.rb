# frozen_string_literal: true

module Kiln
  # Data-parallel training over MPI (DESIGN §10).  Start the script with
  # mpirun (`mpirun -np 4 ruby train.rb`); Open MPI's libmpi is loaded at run
  # time.  The module's functions come from the C extension:
  #
  #   Kiln::Distributed.init                  # joins the job (Kiln::Error outside mpirun)
  #   Kiln::Distributed.rank / .size
  #   Kiln::Distributed.all_reduce(t, :sum)   # :sum, :mean or :max; a recorded op
  #   Kiln::Distributed.average_grads(params) # after backward, before the optimizer
  #   Kiln::Distributed.finalize              # on every rank, before exit
  module Distributed
    # Wraps a Kiln::NN::Module for data-parallel training: every rank starts
    # from rank 0's parameters, and #average_grads (after backward) makes
    # every rank's gradients their mean over the ranks, in buckets that
    # overlap the rest of backward.
    #
    #   model = Kiln::Distributed::DataParallel.new(Net.new)
    #   loss = Kiln::NN::Functional.cross_entropy(model.(x_shard), y_shard)
    #   loss.backward
    #   model.average_grads
    #   optimizer.step
    class DataParallel
      attr_reader :module

      def initialize(mod)
        Distributed.init unless Distributed.initialized?
        @module = mod
        broadcast_parameters
      end

      def call(*args, **kwargs, &block)
        @module.call(*args, **kwargs, &block)
      end

      def average_grads
        Distributed.average_grads(@module.parameters)
        self
      end

      def parameters(...) = @module.parameters(...)
      def train(...) = (@module.train(...); self)
      def eval = (@module.eval; self)
      def state_dict = @module.state_dict
      def load_state_dict(...) = (@module.load_state_dict(...); self)

      private

      # rank 0's values everywhere: a sum in which only rank 0 adds its own
      # (exact: x + 0 + ... + 0 == x)
      def broadcast_parameters
        root = Distributed.rank.zero?
        Kiln.no_grad do
          given = @module.state_dict.transform_values do |t|
            Distributed.all_reduce(root ? t : Kiln.zeros_like(t), :sum)
          end
          @module.load_state_dict(given)
        end
      end
    end
  end
end
