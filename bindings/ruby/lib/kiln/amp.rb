# frozen_string_literal: true

module Kiln
  # Mixed precision (docs/SEMANTICS.md "Half precision"), in the shape of
  # torch.amp:
  #
  #   Kiln::AMP.autocast(:bfloat16) { loss = loss_fn.(model.(x), y) }
  #   loss.backward; opt.step
  #
  # bf16 needs no loss scaling.  For float16, a GradScaler keeps small
  # gradients from flushing to zero:
  #
  #   scaler = Kiln::AMP::GradScaler.new
  #   Kiln::AMP.autocast(:float16) { loss = ... }
  #   scaler.scale(loss).backward
  #   scaler.step(opt)   # skipped when a gradient overflowed
  #   scaler.update      # lowers the scale after an overflow, raises it after
  #                      # growth_interval good steps
  module AMP
    # Within the block, matmuls, linear layers, convolutions and attention on
    # this thread take their float32 operands in `dtype` (f32 accumulation):
    # parameters stay float32 and get float32 gradients.  Nests; restores the
    # setting it found.  enabled: false runs the block unchanged.
    def self.autocast(dtype = :bfloat16, enabled: true)
      return yield unless enabled

      dtype = Kiln.dtype(dtype)
      unless %i[bfloat16 float16].include?(dtype)
        raise Kiln::DTypeError, "Kiln::AMP.autocast: to :bfloat16 or :float16, not #{dtype.inspect}"
      end

      before = Kiln._autocast_dtype
      Kiln._set_autocast(dtype)
      begin
        yield
      ensure
        Kiln._set_autocast(before)
      end
    end

    # the dtype autocast runs in on this thread, or nil when it is off
    def self.autocast_dtype
      dt = Kiln._autocast_dtype
      dt == :float32 ? nil : dt
    end

    # A dynamic loss scaler, as torch.amp.GradScaler.
    class GradScaler
      attr_reader :growth_factor, :backoff_factor, :growth_interval

      def initialize(init_scale: 2.0**16, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000,
                     enabled: true)
        raise ArgumentError, "GradScaler: init_scale must be positive" unless init_scale.positive?
        raise ArgumentError, "GradScaler: growth_factor must be > 1" unless growth_factor > 1
        raise ArgumentError, "GradScaler: backoff_factor must be in (0, 1)" unless backoff_factor.positive? && backoff_factor < 1

        @scale = init_scale.to_f
        @growth_factor = growth_factor.to_f
        @backoff_factor = backoff_factor.to_f
        @growth_interval = Integer(growth_interval)
        @enabled = enabled
        @growth_tracker = 0
        @unscaled = {}.compare_by_identity # optimizer => found an Inf/NaN
      end

      def enabled?
        @enabled
      end

      def get_scale
        @enabled ? @scale : 1.0
      end
      alias scale_value get_scale

      # the loss times the scale (a Tensor: backward from it)
      def scale(loss)
        @enabled ? loss * @scale : loss
      end

      # divides optimizer's gradients by the scale, once per step (before
      # clipping them, as in PyTorch); true when one held an Inf or a NaN
      def unscale_(optimizer)
        return false unless @enabled
        raise Kiln::Error, "GradScaler#unscale_ was already called for this optimizer since the last update" if @unscaled.key?(optimizer)

        params = optimizer.param_groups.flat_map { |g| g[:params] }
        @unscaled[optimizer] = Kiln._unscale_grads(params, 1.0 / @scale)
      end

      # optimizer.step unless a gradient overflowed (then the step is
      # skipped and nil returned)
      def step(optimizer, &closure)
        return optimizer.step(&closure) unless @enabled

        unscale_(optimizer) unless @unscaled.key?(optimizer)
        return nil if @unscaled[optimizer]

        optimizer.step(&closure)
      end

      # after every step: backs the scale off after an overflow, grows it
      # after growth_interval steps without one; new_scale sets it
      def update(new_scale = nil)
        return unless @enabled

        if new_scale
          @scale = new_scale.is_a?(Tensor) ? new_scale.item.to_f : new_scale.to_f
          @growth_tracker = 0
        elsif @unscaled.values.any?
          @scale *= @backoff_factor
          @growth_tracker = 0
        else
          @growth_tracker += 1
          if @growth_tracker == @growth_interval
            @scale *= @growth_factor
            @growth_tracker = 0
          end
        end
        @unscaled.clear
        nil
      end

      def state_dict
        { "scale" => @scale, "growth_factor" => @growth_factor, "backoff_factor" => @backoff_factor,
          "growth_interval" => @growth_interval, "_growth_tracker" => @growth_tracker }
      end

      def load_state_dict(state)
        s = state.transform_keys(&:to_s)
        @scale = s.fetch("scale").to_f
        @growth_factor = s.fetch("growth_factor", @growth_factor).to_f
        @backoff_factor = s.fetch("backoff_factor", @backoff_factor).to_f
        @growth_interval = Integer(s.fetch("growth_interval", @growth_interval))
        @growth_tracker = Integer(s.fetch("_growth_tracker", 0))
      end
    end
  end
end
