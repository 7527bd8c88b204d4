# frozen_string_literal: true

# Kiln::Signature: the one argument parser behind every method that takes
# PyTorch's named arguments (dim, keepdim, dtype, ...).  A method is written
# with plain positional parameters; `signature "chunk(int chunks, int dim=0)"`
# after it wraps it so that each argument may be given positionally or as a
# keyword (as torch-rb takes them), and a wrong one raises an error naming
# the method the user called and what it expected.
module Kiln
  class Signature
    Param = Struct.new(:name, :keys, :type, :default, :required, :positional)

    # what each type accepts, and how the error says it
    TYPES = {
      "int" => ["an Integer", ->(v) { v.is_a?(Integer) }],
      "int?" => ["an Integer or nil", ->(v) { v.nil? || v.is_a?(Integer) }],
      "int[]" => ["an Integer or an Array of Integers",
                  ->(v) { v.is_a?(Integer) || (v.is_a?(Array) && v.all?(Integer)) }],
      "int[]?" => ["nil, an Integer or an Array of Integers",
                   ->(v) { v.nil? || v.is_a?(Integer) || (v.is_a?(Array) && v.all?(Integer)) }],
      "bool" => ["true or false", ->(v) { v == true || v == false }],
      "bool?" => ["true, false or nil", ->(v) { v.nil? || v == true || v == false }],
      "float" => ["a number", ->(v) { v.is_a?(Numeric) }],
      "float?" => ["a number or nil", ->(v) { v.nil? || v.is_a?(Numeric) }],
      "scalar" => ["a number or true/false", ->(v) { v.is_a?(Numeric) || v == true || v == false }],
      "dtype" => ["a dtype (a Symbol or String such as :float32)", ->(v) { v.is_a?(Symbol) || v.is_a?(String) }],
      "dtype?" => ["a dtype (a Symbol or String such as :float32) or nil",
                   ->(v) { v.nil? || v.is_a?(Symbol) || v.is_a?(String) }],
      "Tensor" => ["a Kiln::Tensor", ->(v) { v.is_a?(Tensor) }],
      "Tensor?" => ["a Kiln::Tensor or nil", ->(v) { v.nil? || v.is_a?(Tensor) }],
      "index" => ["a Kiln::Tensor or an Array of Integers", ->(v) { v.is_a?(Tensor) || v.is_a?(Array) }],
      "value" => ["a Kiln::Tensor, a number or true/false",
                  ->(v) { v.is_a?(Tensor) || v.is_a?(Numeric) || v == true || v == false }],
      "any" => ["anything", ->(_) { true }]
    }.freeze
    # the same tests as Ruby expressions (v: the value), inlined into the
    # generated methods' fast path
    CHECKS = {
      "int" => "Integer === v", "int?" => "(v.nil? || Integer === v)",
      "int[]" => "(Integer === v || (Array === v && v.all?(Integer)))",
      "int[]?" => "(v.nil? || Integer === v || (Array === v && v.all?(Integer)))",
      "bool" => "(true.equal?(v) || false.equal?(v))", "bool?" => "(v.nil? || true.equal?(v) || false.equal?(v))",
      "float" => "Numeric === v", "float?" => "(v.nil? || Numeric === v)",
      "scalar" => "(Numeric === v || true.equal?(v) || false.equal?(v))",
      "dtype" => "(Symbol === v || String === v)", "dtype?" => "(v.nil? || Symbol === v || String === v)",
      "Tensor" => "Kiln::Tensor === v", "Tensor?" => "(v.nil? || Kiln::Tensor === v)",
      "index" => "(Kiln::Tensor === v || Array === v)",
      "value" => "(Kiln::Tensor === v || Numeric === v || true.equal?(v) || false.equal?(v))",
      "any" => "true"
    }.freeze
    UNSET = Object.new.freeze # an argument not given
    DEFAULTS = { "None" => nil, "True" => true, "False" => false }.freeze
    ALL = [] # every signature, so generated methods find theirs by index

    attr_reader :name, :label, :params

    # text: "name(type name|alias=default, ..., *, keyword_only=...)" in
    # PyTorch's notation; "int... dim" collects leading Integers (sum(0, 1))
    def initialize(text, label)
      m = /\A(\w+[?!]?)\((.*)\)\z/.match(text) or raise ArgumentError, "bad signature #{text.inspect}"
      @name = m[1]
      @label = label
      @params = []
      positional = true
      m[2].split(",").map(&:strip).reject(&:empty?).each do |spec|
        if spec == "*"
          positional = false
          next
        end
        pm = /\A(\S+)\s+([\w|]+)(?:=(.+))?\z/.match(spec) or raise ArgumentError, "bad parameter #{spec.inspect}"
        type, keys, default = pm[1], pm[2].split("|").map(&:to_sym), pm[3]
        greedy = type.end_with?("...")
        type = default.nil? ? "int[]" : "int[]?" if greedy
        raise ArgumentError, "unknown type #{type}" unless TYPES.key?(type)

        p = Param.new(keys[0], keys, type, parse_default(default), default.nil?, positional)
        p[:positional] = :greedy if greedy
        @params << p
      end
      @npos = @params.count(&:positional)
      @index = {}
      @params.each_with_index { |p, i| p.keys.each { |k| @index[k] = i } }
      @usage = "#{label}(#{@params.map { |p| usage_of(p) }.join(', ')})"
    end

    # the values of every parameter, in order, from a call's arguments
    def bind(args, kw, label = @label)
      n = @params.size
      out = Array.new(n, UNSET)
      given = nil
      i = 0
      j = 0
      while j < args.size
        if i >= @npos
          raise ArgumentError, "#{usage(label)}: too many positional arguments (#{args.size}; " \
                               "it takes #{@npos})"
        end
        if @params[i].positional == :greedy && args[j].is_a?(Integer)
          k = j
          k += 1 while k < args.size && args[k].is_a?(Integer)
          out[i] = k - j == 1 ? args[j] : args[j...k]
          j = k
        else
          out[i] = args[j]
          j += 1
        end
        i += 1
      end
      unless kw.empty?
        # how each was given: true (positionally) or its keyword
        given = Array.new(n)
        i.times { |x| given[x] = true }
        kw.each do |key, v|
          idx = @index[key]
          if idx.nil?
            raise ArgumentError, "#{usage(label)}: unknown keyword #{key}: (it takes " \
                                 "#{@params.map { |p| "#{p.name}:" }.join(', ')})"
          end
          if given[idx]
            first = given[idx] == true ? "positionally" : "as #{given[idx]}:"
            raise ArgumentError, "#{usage(label)}: #{@params[idx].name} given twice " \
                                 "(#{first} and as #{key}:)"
          end
          out[idx] = v
          given[idx] = key
        end
      end
      idx = 0
      while idx < n
        p = @params[idx]
        v = out[idx]
        if UNSET.equal?(v)
          raise ArgumentError, "#{usage(label)}: missing #{p.name}" if p.required

          out[idx] = p.default
        elsif !TYPES[p.type][1].call(v)
          type_error(idx, v, label)
        end
        idx += 1
      end
      out
    end

    def type_error(idx, v, label = @label)
      p = @params[idx]
      raise TypeError, "#{label}: #{p.name} must be #{TYPES[p.type][0]}, not #{v.inspect} (#{usage(label)})"
    end

    # Ruby source of the method wrapping impl: positional-only calls take
    # an inlined fast path (no allocation beyond Ruby's own), anything else
    # goes through bind
    def wrapper_source(id, impl)
      sig = "Kiln::Signature::ALL[#{id}]"
      if @params.any? { |p| p.positional == :greedy }
        # the leading Integers' count decides the positions: bind sorts them
        # out, but for the common calls (none or one positional) of a
        # signature that starts with the greedy parameter
        if @params[0].positional == :greedy
          p0 = @params[0]
          rest = (1...@params.size).map { |i| "#{sig}.params[#{i}].default" }
          first = p0.required ? "raise ArgumentError, \"\#{#{sig}.usage}: missing #{p0.name}\"" : "#{sig}.params[0].default"
          return <<~RUBY
            def #{@name}(*args, **kw)
              return #{impl}(*#{sig}.bind(args, kw)) unless kw.empty? && #{@npos == 1 ? 'true' : 'args.size <= 1'}

              if args.empty? then v = #{first}
              else v = args.size == 1 ? args[0] : args; #{sig}.type_error(0, v) unless #{CHECKS[p0.type]}
              end
              #{impl}(#{(['v'] + rest).join(', ')})
            end
          RUBY
        end
        return <<~RUBY
          def #{@name}(*args, **kw)
            #{impl}(*#{sig}.bind(args, kw))
          end
        RUBY
      end
      pos = (0...@npos).map { |i| "p#{i} = Kiln::Signature::UNSET" }
      header = (pos + ["*rest", "**kw"]).join(", ")
      given = (0...@npos).map { |i| "p#{i}" }.join(", ")
      lines = []
      vals = []
      @params.each_with_index do |p, i|
        if p.positional
          v = "p#{i}"
          if p.required
            lines << "raise ArgumentError, \"\#{#{sig}.usage}: missing #{p.name}\" if Kiln::Signature::UNSET.equal?(#{v})"
            lines << "v = #{v}; #{sig}.type_error(#{i}, v) unless #{CHECKS[p.type]}" unless p.type == "any"
          else
            lines << "if Kiln::Signature::UNSET.equal?(#{v}) then #{v} = #{sig}.params[#{i}].default"
            lines << "else v = #{v}; #{sig}.type_error(#{i}, v) unless #{CHECKS[p.type]}; end"
          end
          vals << v
        else
          vals << "#{sig}.params[#{i}].default"
        end
      end
      <<~RUBY
        def #{@name}(#{header})
          unless rest.empty? && kw.empty?
            return #{impl}(*#{sig}.bind([#{given}].take_while { |a| !Kiln::Signature::UNSET.equal?(a) } + rest, kw))
          end
          #{lines.join("
  ")}
          #{impl}(#{vals.join(', ')})
        end
      RUBY
    end

    def usage(label = @label)
      # a module function (Kiln.sum) takes the tensor first
      label == @label ? @usage : @usage.sub("#{@label}(", "#{label}(input#{@params.empty? ? '' : ', '}")
    end

    private

    def parse_default(text)
      return nil if text.nil?
      return DEFAULTS[text] if DEFAULTS.key?(text)
      return Integer(text) if /\A-?\d+\z/.match?(text)
      return Float(text) if /\A-?[\d.e+-]+\z/.match?(text)
      return text[1..].to_sym if text.start_with?(":")

      text.delete('"')
    end

    def usage_of(p)
      s = p.positional ? p.name.to_s : "#{p.name}:"
      s = "#{s}..." if p.positional == :greedy
      p.required ? s : "#{s}=#{p.default.inspect}"
    end

    # `signature "..."` in a class body (or `class << self`): wraps the method
    # of that name defined before it
    module DSL
      def signature(text, label: nil)
        name = text[/\A\w+[?!]?/]
        label ||= Signature.label_for(self, name)
        sig = Signature.new(text, label)
        id = ALL.size
        ALL << sig
        impl = Signature.impl_name(name)
        alias_method impl, name
        private impl
        class_eval sig.wrapper_source(id, impl), __FILE__, __LINE__
        sig
      end

      # Kiln.name(input, ...): the Tensor method of that name as a module
      # function, parsed by the same signature (its errors name Kiln.name);
      # out: a tensor of the result's shape, assigned the result (torch's
      # out=) and returned
      def tensor_function(name, method = name)
        sig = ALL.find { |s| s.name == method.to_s && s.label.start_with?("Kiln::Tensor#") }
        label = "#{Signature.label_for(self, name)}"
        if sig
          id = ALL.index(sig)
          impl = Signature.impl_name(method)
          class_eval <<~RUBY, __FILE__, __LINE__ + 1
            def #{name}(input, *args, **kw)
              return Kiln::Signature.out!(kw.delete(:out), #{name}(input, *args, **kw), #{label.inspect}) if kw.key?(:out)

              Kiln::Signature.input!(input, #{label.inspect}).__send__(:#{impl}, *Kiln::Signature::ALL[#{id}].bind(args, kw, #{label.inspect}))
            end
          RUBY
        else
          class_eval <<~RUBY, __FILE__, __LINE__ + 1
            def #{name}(input, *args, **kw, &block)
              return Kiln::Signature.out!(kw.delete(:out), #{name}(input, *args, **kw), #{label.inspect}) if kw.key?(:out)

              Kiln::Signature.input!(input, #{label.inspect}).#{method}(*args, **kw, &block)
            end
          RUBY
        end
      end
    end

    class << self
      # the private name a wrapped method's body keeps (add! and add differ)
      def impl_name(name)
        :"__#{name.to_s.sub(/!\z/, '_bang').sub(/\?\z/, '_p')}_impl"
      end

      def label_for(owner, name)
        if owner.singleton_class?
          target = owner.inspect[/\A#<Class:(.+)>\z/, 1]
          "#{target}.#{name}"
        else
          "#{owner.name}##{name}"
        end
      end

      # torch's out=: the result assigned to out (same shape; out's dtype)
      def out!(out, result, label)
        raise TypeError, "#{label}: out must be a Kiln::Tensor, not #{out.inspect}" unless out.is_a?(Tensor)
        unless result.is_a?(Tensor) && out.shape == result.shape
          raise Kiln::ShapeError, "#{label}: out has shape #{out.shape}, the result #{result.is_a?(Tensor) ? result.shape : result.class}"
        end

        out.assign!(result.dtype == out.dtype ? result : result._cast(out.dtype))
      end

      # the first argument of a module function: a Tensor (an Array or a
      # number becomes one)
      def input!(x, label)
        return x if x.is_a?(Tensor)
        return Kiln.tensor(x) if x.is_a?(Array) || x.is_a?(Numeric) || x == true || x == false

        raise TypeError, "#{label}: input must be a Kiln::Tensor, not #{x.inspect}"
      end
    end
  end
end
