# frozen_string_literal: true

module Kiln
  module Utils
    # Datasets and a loader in the shape of torch-rb's Torch::Utils::Data:
    #
    #   ds = Kiln::Utils::Data::TensorDataset.new(x, y)
    #   loader = Kiln::Utils::Data::DataLoader.new(ds, batch_size: 64, shuffle: true)
    #   loader.each { |xb, yb| ... }
    #
    # A TensorDataset's batches are gathered from its tensors with one
    # index_select per tensor (no Ruby loop over rows); other datasets (any
    # object with #size and #[]) are batched by stacking their items.
    # Shuffling draws from Kiln's RNG (Kiln.randperm), so Kiln.manual_seed
    # repeats the order.
    module Data
      class TensorDataset
        attr_reader :tensors

        def initialize(*tensors)
          raise ArgumentError, "TensorDataset: give at least one tensor" if tensors.empty?

          tensors.each_with_index do |t, i|
            raise TypeError, "TensorDataset: argument #{i} is a #{t.class}, not a Kiln::Tensor" unless t.is_a?(Tensor)
            raise Kiln::ShapeError, "TensorDataset: argument #{i} is 0-d" if t.dim.zero?
          end
          sizes = tensors.map { |t| t.shape[0] }
          raise Kiln::ShapeError, "TensorDataset: first dimensions differ: #{sizes.inspect}" unless sizes.uniq.size == 1

          @tensors = tensors
        end

        def size
          @tensors[0].shape[0]
        end
        alias length size

        def [](index)
          @tensors.map { |t| t[index] }
        end

        # the rows at an :int64 index tensor, one tensor per dataset tensor
        def batch(indices)
          @tensors.map { |t| t.index_select(0, indices) }
        end
      end

      class DataLoader
        include Enumerable

        attr_reader :dataset, :batch_size

        def initialize(dataset, batch_size: 1, shuffle: false, drop_last: false)
          unless batch_size.is_a?(Integer) && batch_size.positive?
            raise ArgumentError, "DataLoader: batch_size must be a positive Integer, got #{batch_size.inspect}"
          end

          @dataset = dataset
          @batch_size = batch_size
          @shuffle = shuffle
          @drop_last = drop_last
        end

        # batches per epoch
        def size
          n = @dataset.size
          @drop_last ? n / @batch_size : (n + @batch_size - 1) / @batch_size
        end
        alias length size

        def each
          return to_enum(:each) { size } unless block_given?

          n = @dataset.size
          order = @shuffle ? Kiln.randperm(n) : Kiln.arange(n)
          size.times do |b|
            lo = b * @batch_size
            hi = [lo + @batch_size, n].min
            idx = order[lo...hi]
            yield(*batch(idx))
          end
        end

        private

        def batch(idx)
          return @dataset.batch(idx) if @dataset.respond_to?(:batch)

          items = idx.to_a.map { |i| Array(@dataset[i]) }
          items.transpose.map do |column|
            column.all?(Tensor) ? Kiln.stack(column, 0) : Kiln.tensor(column)
          end
        end
      end
    end
  end
end
