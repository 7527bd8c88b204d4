# frozen_string_literal: true

module Kiln
  # Optimizers in the shape of torch-rb's Torch::Optim:
  #
  #   opt = Kiln::Optim::Adam.new(model.parameters, lr: 1e-3)
  #   opt.zero_grad; loss.backward; opt.step
  #
  # A step writes each parameter in place under no_grad (sub_scaled! /
  # assign!: the parameter's handle is rebound to the new value) and rebinds
  # its state tensors (momentum, Adam's moments) to new values, so that a
  # training step is the same trace every time.  Learning rates and the other
  # hyperparameters are host scalars (weak scalars / kiln_sub_scaled_'s
  # alpha), not part of the trace: changing them (a scheduler) never
  # recompiles.
  module Optim
    class Optimizer
      attr_reader :param_groups, :state, :defaults

      # params: an Array of tensors, or of Hashes ({params: [...], lr: ...})
      # whose keys override the defaults for that group
      def initialize(params, defaults)
        @defaults = defaults
        @state = {}.compare_by_identity
        list = params.to_a
        raise ArgumentError, "#{self.class}: no parameters to optimize" if list.empty?

        groups = list.first.is_a?(Hash) ? list : [{ params: list }]
        @param_groups = groups.map do |g|
          g = g.transform_keys(&:to_sym)
          ps = Array(g[:params])
          ps.each do |p|
            raise TypeError, "#{self.class}: #{p.class} is not a Kiln::Tensor" unless p.is_a?(Tensor)
          end
          defaults.merge(g).merge(params: ps)
        end
      end

      # drops every parameter's gradient (torch's set_to_none: true)
      def zero_grad(set_to_none: true)
        @param_groups.each { |g| g[:params].each(&:zero_grad!) }
        nil
      end

      def add_param_group(group)
        g = group.transform_keys(&:to_sym)
        @param_groups << @defaults.merge(g).merge(params: Array(g[:params]))
      end

      # runs the update; with a block, evaluates it first (the closure
      # returning the loss) and returns its value
      def step(&closure)
        loss = closure&.call
        Kiln.no_grad do
          @param_groups.each do |group|
            group[:params].each do |p|
              g = p.grad
              next if g.nil?

              update(p, g, group, @state[p] ||= {})
            end
          end
        end
        loss
      end
    end

    # SGD with momentum, dampening, weight decay (L2, added to the gradient)
    # and Nesterov momentum, as torch.optim.SGD
    class SGD < Optimizer
      def initialize(params, lr:, momentum: 0, dampening: 0, weight_decay: 0, nesterov: false)
        if nesterov && (momentum <= 0 || dampening != 0)
          raise ArgumentError, "SGD: nesterov needs momentum > 0 and dampening 0"
        end

        super(params, { lr: lr, momentum: momentum, dampening: dampening, weight_decay: weight_decay,
                        nesterov: nesterov })
      end

      private

      def update(p, g, group, state)
        wd = group[:weight_decay]
        g += p * wd unless wd.zero?
        mu = group[:momentum]
        unless mu.zero?
          buf = state[:momentum_buffer]
          buf = buf.nil? ? g : buf * mu + g * (1 - group[:dampening])
          state[:momentum_buffer] = buf # rebound each step
          g = group[:nesterov] ? g + buf * mu : buf
        end
        p.sub_scaled!(g, group[:lr])
      end
    end

    # Adam (weight_decay: L2 added to the gradient, as torch.optim.Adam)
    class Adam < Optimizer
      def initialize(params, lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0, amsgrad: false)
        super(params, { lr: lr, betas: betas, eps: eps, weight_decay: weight_decay, amsgrad: amsgrad })
      end

      private

      def decoupled?
        false
      end

      def update(p, g, group, state)
        lr = group[:lr]
        b1, b2 = group[:betas]
        wd = group[:weight_decay]
        if decoupled?
          p.sub_scaled!(p, lr * wd) unless wd.zero? # p *= 1 - lr * wd
        elsif !wd.zero?
          g += p * wd
        end
        t = state[:step] = (state[:step] || 0) + 1
        m = state[:exp_avg] || Kiln.zeros_like(p)
        v = state[:exp_avg_sq] || Kiln.zeros_like(p)
        m = m * b1 + g * (1 - b1)
        v = v * b2 + g * g * (1 - b2)
        state[:exp_avg] = m
        state[:exp_avg_sq] = v
        if group[:amsgrad]
          vmax = state[:max_exp_avg_sq]
          v = vmax.nil? ? v : vmax.maximum(v)
          state[:max_exp_avg_sq] = v
        end
        bc1 = 1 - b1**t
        bc2 = 1 - b2**t
        denom = v.sqrt * (1.0 / Math.sqrt(bc2)) + group[:eps]
        p.sub_scaled!(m / denom, lr / bc1)
      end
    end

    # Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW
    class AdamW < Adam
      def initialize(params, lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weight_decay: 1e-2, amsgrad: false)
        super
      end

      private

      def decoupled?
        true
      end
    end

    module LRScheduler
      # sets each param group's :lr from its initial lr and the epoch count;
      # step is called once per epoch (after optimizer.step)
      class LRScheduler
        attr_reader :last_epoch, :optimizer

        def initialize(optimizer, last_epoch: -1)
          @optimizer = optimizer
          optimizer.param_groups.each { |g| g[:initial_lr] ||= g[:lr] }
          @base_lrs = optimizer.param_groups.map { |g| g[:initial_lr] }
          @last_epoch = last_epoch
          step
        end

        def step
          @last_epoch += 1
          @optimizer.param_groups.zip(@base_lrs).each { |g, base| g[:lr] = lr_at(base, @last_epoch) }
          nil
        end

        def get_last_lr
          @optimizer.param_groups.map { |g| g[:lr] }
        end
        alias last_lr get_last_lr
      end

      # lr = initial * gamma ** (epoch / step_size)
      class StepLR < LRScheduler
        def initialize(optimizer, step_size:, gamma: 0.1, last_epoch: -1)
          @step_size = step_size
          @gamma = gamma
          super(optimizer, last_epoch: last_epoch)
        end

        private

        def lr_at(base, epoch)
          base * @gamma**(epoch / @step_size)
        end
      end

      # lr = eta_min + (initial - eta_min) * (1 + cos(pi * epoch / t_max)) / 2
      # (torch's closed form)
      class CosineAnnealingLR < LRScheduler
        def initialize(optimizer, t_max, eta_min: 0.0, last_epoch: -1)
          @t_max = t_max
          @eta_min = eta_min
          super(optimizer, last_epoch: last_epoch)
        end

        private

        def lr_at(base, epoch)
          @eta_min + (base - @eta_min) * (1 + Math.cos(Math::PI * epoch / @t_max)) / 2
        end
      end
    end
  end
end
