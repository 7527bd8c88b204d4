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
      HALF_DTYPES = %i[bfloat16 float16].freeze

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
      # set_to_none: false zeroes the gradients there are (torch's; a
      # parameter without one keeps none)
      def zero_grad(set_to_none: true)
        @param_groups.each { |g| g[:params].each { |p| Optimizer.zero_grad_of(p, set_to_none) } }
        nil
      end

      def self.zero_grad_of(param, set_to_none)
        if set_to_none || param.grad.nil?
          param.zero_grad!
        else
          param.grad = Kiln.zeros_like(param.grad)
        end
      end

      # a saved state tensor as this optimizer's own (a copy; the master
      # copy of a half parameter stays float32, moments follow the parameter)
      def loaded_state_tensor(v, param, key)
        unless key.to_sym == :master || v.shape == param.shape
          raise Kiln::ShapeError, "#{self.class}#load_state_dict: #{key} has shape #{v.shape}, its parameter #{param.shape}"
        end

        Kiln.zeros_like(v).assign!(v.detach)
      end

      # state[key] = value, as a store: the state's handle is rebound to the
      # new value (assign!), so the flush that computes it keeps it.  A
      # plain Ruby rebinding left the value recomputable: the next step
      # recomputed the last one's update until the key learned to keep it,
      # so a first training run in a process flushed (and, with loops
      # rolled, rounded) otherwise than the ones after it.
      def keep_state(state, key, value)
        (state[key] ||= Kiln.zeros_like(value)).assign!(value)
      end

      # torch-rb's {state: {index => {step: n, exp_avg: tensor, ...}},
      # param_groups: [{lr: ..., params: [index, ...]}, ...]}: parameters
      # by their position across the groups; tensors are detached
      # snapshots (Kiln's updates rebind handles, so they keep the values
      # they had).  Marshal.dump writes it; load_state_dict reads it back.
      def state_dict
        index = {}.compare_by_identity
        groups = @param_groups.map do |g|
          g.merge(params: g[:params].map { |p| index[p] ||= index.size })
        end
        packed = {}
        @state.each do |p, st|
          next unless index.key?(p)

          packed[index[p]] = st.transform_values { |v| v.is_a?(Tensor) ? v.detach : v }
        end
        { state: packed, param_groups: groups }
      end

      # the hyperparameters and state of state_dict (an optimizer's over
      # parameters of the same shapes, in the same order and groups)
      def load_state_dict(state_dict)
        sd = state_dict.transform_keys(&:to_sym)
        groups = Array(sd[:param_groups]).map { |g| g.transform_keys(&:to_sym) }
        unless groups.size == @param_groups.size &&
               groups.zip(@param_groups).all? { |a, b| Array(a[:params]).size == b[:params].size }
          raise ArgumentError, "#{self.class}#load_state_dict: its parameter groups (#{groups.map { |g| Array(g[:params]).size }}) " \
                               "do not match this optimizer's (#{@param_groups.map { |g| g[:params].size }})"
        end
        by_index = {}
        groups.zip(@param_groups).each do |saved, mine|
          Array(saved[:params]).zip(mine[:params]).each { |i, p| by_index[i] = p }
        end
        state = {}.compare_by_identity
        (sd[:state] || {}).each do |i, st|
          p = by_index[i.is_a?(String) ? Integer(i) : i]
          raise ArgumentError, "#{self.class}#load_state_dict: state for parameter #{i.inspect}, which no group has" unless p

          state[p] = st.to_h { |k, v| [k.to_sym, v.is_a?(Tensor) ? loaded_state_tensor(v, p, k) : v] }
        end
        @param_groups = groups.zip(@param_groups).map { |saved, mine| mine.merge(saved.except(:params)) }
        @state = state
        self
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

              state = @state[p] ||= {}
              if HALF_DTYPES.include?(p.dtype)
                # a bf16/f16 parameter: updated in its float32 master copy
                # (and the optimizer's state in float32), then rounded back
                master = state[:master] ||= p.float
                update(master, g.float, group, state)
                p.copy!(master)
              else
                update(p, g, group, state)
              end
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
          buf = keep_state(state, :momentum_buffer, buf)
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
        m = keep_state(state, :exp_avg, m)
        v = keep_state(state, :exp_avg_sq, v)
        if group[:amsgrad]
          vmax = state[:max_exp_avg_sq]
          v = vmax.nil? ? v : vmax.maximum(v)
          v = keep_state(state, :max_exp_avg_sq, v)
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

    # RMSprop, as torch.optim.RMSprop: a running mean of squared gradients
    # (alpha) divides the step; centered subtracts the squared running mean
    # of the gradients; momentum keeps a buffer of the scaled steps
    class RMSprop < Optimizer
      def initialize(params, lr: 1e-2, alpha: 0.99, eps: 1e-8, weight_decay: 0, momentum: 0, centered: false)
        raise ArgumentError, "RMSprop: alpha must be in [0, 1), got #{alpha}" unless alpha >= 0 && alpha < 1
        raise ArgumentError, "RMSprop: eps must be >= 0, got #{eps}" if eps.negative?

        super(params, { lr: lr, alpha: alpha, eps: eps, weight_decay: weight_decay, momentum: momentum,
                        centered: centered })
      end

      private

      def update(p, g, group, state)
        wd = group[:weight_decay]
        g += p * wd unless wd.zero?
        alpha = group[:alpha]
        sq = state[:square_avg] || Kiln.zeros_like(p)
        sq = sq * alpha + g * g * (1 - alpha)
        sq = keep_state(state, :square_avg, sq)
        if group[:centered]
          ga = state[:grad_avg] || Kiln.zeros_like(p)
          ga = ga * alpha + g * (1 - alpha)
          ga = keep_state(state, :grad_avg, ga)
          avg = (sq - ga * ga).sqrt + group[:eps]
        else
          avg = sq.sqrt + group[:eps]
        end
        step = g / avg
        mu = group[:momentum]
        unless mu.zero?
          buf = state[:momentum_buffer] || Kiln.zeros_like(p)
          step = buf * mu + step
          step = keep_state(state, :momentum_buffer, step)
        end
        p.sub_scaled!(step, group[:lr])
      end
    end

    # Adagrad, as torch.optim.Adagrad: the sum of squared gradients divides
    # the step; the learning rate decays as lr / (1 + (step - 1) * lr_decay)
    class Adagrad < Optimizer
      def initialize(params, lr: 1e-2, lr_decay: 0, weight_decay: 0, initial_accumulator_value: 0, eps: 1e-10)
        raise ArgumentError, "Adagrad: lr_decay must be >= 0, got #{lr_decay}" if lr_decay.negative?
        if initial_accumulator_value.negative?
          raise ArgumentError, "Adagrad: initial_accumulator_value must be >= 0, got #{initial_accumulator_value}"
        end

        super(params, { lr: lr, lr_decay: lr_decay, weight_decay: weight_decay,
                        initial_accumulator_value: initial_accumulator_value, eps: eps })
      end

      private

      def update(p, g, group, state)
        t = state[:step] = (state[:step] || 0) + 1
        wd = group[:weight_decay]
        g += p * wd unless wd.zero?
        clr = group[:lr] / (1 + (t - 1) * group[:lr_decay])
        sum = state[:sum] || Kiln.full_like(p, group[:initial_accumulator_value])
        sum += g * g
        sum = keep_state(state, :sum, sum)
        p.sub_scaled!(g / (sum.sqrt + group[:eps]), clr)
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

      # Cuts each group's lr by factor when a metric (step(metric), once per
      # epoch) stopped improving for more than patience epochs, as
      # torch.optim.lr_scheduler.ReduceLROnPlateau: mode :min or :max,
      # threshold relative (:rel) or absolute (:abs), cooldown epochs after
      # a cut, min_lr a floor (one number, or one per group), changes
      # smaller than eps skipped
      class ReduceLROnPlateau
        attr_reader :optimizer, :best, :num_bad_epochs, :last_epoch

        def initialize(optimizer, mode: :min, factor: 0.1, patience: 10, threshold: 1e-4, threshold_mode: :rel,
                       cooldown: 0, min_lr: 0, eps: 1e-8)
          raise ArgumentError, "ReduceLROnPlateau: factor must be < 1.0, got #{factor}" if factor >= 1.0
          unless %w[min max].include?(mode.to_s)
            raise ArgumentError, "ReduceLROnPlateau: mode is :min or :max, not #{mode.inspect}"
          end
          unless %w[rel abs].include?(threshold_mode.to_s)
            raise ArgumentError, "ReduceLROnPlateau: threshold_mode is :rel or :abs, not #{threshold_mode.inspect}"
          end

          @optimizer = optimizer
          n = optimizer.param_groups.size
          @min_lrs = min_lr.is_a?(Array) ? min_lr.dup : [min_lr] * n
          if @min_lrs.size != n
            raise ArgumentError, "ReduceLROnPlateau: #{@min_lrs.size} min_lr values for #{n} param groups"
          end

          @mode = mode.to_s
          @factor = factor
          @patience = patience
          @threshold = threshold
          @threshold_mode = threshold_mode.to_s
          @cooldown = cooldown
          @eps = eps
          @best = @mode == "min" ? Float::INFINITY : -Float::INFINITY
          @num_bad_epochs = 0
          @cooldown_counter = 0
          @last_epoch = 0
        end

        # metric: a number or a 0-d tensor (read: one wait)
        def step(metric)
          current = metric.is_a?(Tensor) ? metric.item : Float(metric)
          @last_epoch += 1
          if better?(current)
            @best = current
            @num_bad_epochs = 0
          else
            @num_bad_epochs += 1
          end
          if @cooldown_counter.positive?
            @cooldown_counter -= 1
            @num_bad_epochs = 0
          end
          if @num_bad_epochs > @patience
            reduce_lr
            @cooldown_counter = @cooldown
            @num_bad_epochs = 0
          end
          nil
        end

        def get_last_lr
          @optimizer.param_groups.map { |g| g[:lr] }
        end
        alias last_lr get_last_lr

        def in_cooldown?
          @cooldown_counter.positive?
        end

        private

        def better?(a)
          rel = @threshold_mode == "rel"
          if @mode == "min"
            rel ? a < @best * (1 - @threshold) : a < @best - @threshold
          else
            rel ? a > @best * (1 + @threshold) : a > @best + @threshold
          end
        end

        def reduce_lr
          @optimizer.param_groups.each_with_index do |g, i|
            old = g[:lr]
            new = [old * @factor, @min_lrs[i]].max
            g[:lr] = new if old - new > @eps
          end
        end
      end

      # lr = eta_min + (initial - eta_min) * (1 + cos(pi * epoch / t_max)) / 2
      # (torch's closed form)
      # lr = initial * gamma ** epoch
      class ExponentialLR < LRScheduler
        def initialize(optimizer, gamma:, last_epoch: -1)
          @gamma = gamma
          super(optimizer, last_epoch: last_epoch)
        end

        private

        def lr_at(base, epoch)
          base * @gamma**epoch
        end
      end

      # lr = initial * gamma ** (the milestones passed)
      class MultiStepLR < LRScheduler
        def initialize(optimizer, milestones:, gamma: 0.1, last_epoch: -1)
          @milestones = milestones.sort
          @gamma = gamma
          super(optimizer, last_epoch: last_epoch)
        end

        private

        def lr_at(base, epoch)
          base * @gamma**@milestones.count { |m| m <= epoch }
        end
      end

      # lr = initial * lr_lambda.(epoch) (one lambda, or one per group)
      class LambdaLR < LRScheduler
        def initialize(optimizer, lr_lambda, last_epoch: -1)
          groups = optimizer.param_groups.size
          @lambdas = lr_lambda.is_a?(Array) ? lr_lambda : [lr_lambda] * groups
          raise ArgumentError, "LambdaLR: #{@lambdas.size} lambdas for #{groups} param groups" unless @lambdas.size == groups

          super(optimizer, last_epoch: last_epoch)
        end

        def step
          @last_epoch += 1
          @optimizer.param_groups.each_with_index do |g, i|
            g[:lr] = g[:initial_lr] * @lambdas[i].call(@last_epoch)
          end
          nil
        end
      end

      # lr = initial * a factor going linearly from start_factor to
      # end_factor over total_iters epochs, then staying there
      class LinearLR < LRScheduler
        def initialize(optimizer, start_factor: 1.0 / 3, end_factor: 1.0, total_iters: 5, last_epoch: -1)
          raise ArgumentError, "LinearLR: start_factor must be in (0, 1], got #{start_factor}" unless start_factor.positive? && start_factor <= 1

          @start = start_factor
          @end = end_factor
          @total = total_iters
          super(optimizer, last_epoch: last_epoch)
        end

        private

        def lr_at(base, epoch)
          t = [epoch, @total].min
          base * (@start + (@end - @start) * t / @total.to_f)
        end
      end

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
