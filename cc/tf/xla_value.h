// XlaValue: a compute type whose arithmetic builds XLA instead of computing, so the very
// Prepare()/Update() a rule gives the CPU and CUDA engines also gives the XLA lowering.
// `var -= p.alpha * m / (Sqrt(v) + p.epsilon)` on XlaValues emits Sub, Mul, Div, Sqrt, Add
// over whole arrays (parameters are scalars, broadcast by XLA). Literals such as C(1)
// become constants of the compute type of the kernel being compiled: an XlaValueScope
// names that builder and type for the thread while a kernel compiles.
//
// Two divisions are emitted in a form XLA's algebraic simplifier leaves alone, so that they
// round as the engines' do: x / Sqrt(y) (which it makes x * rsqrt(y), two roundings) as
// -(x / -Sqrt(y)), the same IEEE quotient; x / literal (which it makes x times the
// literal's reciprocal) with the literal behind an optimization barrier.
#pragma once

#include <type_traits>

#if __has_include("xla/hlo/builder/xla_builder.h")
#include "xla/hlo/builder/lib/constants.h"
#include "xla/hlo/builder/xla_builder.h"
#else  // TF 2.15
#include "xla/client/lib/constants.h"
#include "xla/client/xla_builder.h"
#endif

namespace fusedopt {
namespace tf {

class XlaValueScope;

class XlaValue {
 public:
  XlaValue() = default;
  XlaValue(xla::XlaOp op) : op_(op) {}  // NOLINT: rules mix values and ops freely
  template <typename N, typename = std::enable_if_t<std::is_arithmetic_v<N>>>
  XlaValue(N literal)  // NOLINT: C(1)
      : op_(Constant(static_cast<double>(literal))), kind_(Kind::kLiteral) {}

  xla::XlaOp op() const { return op_; }

  friend XlaValue operator+(const XlaValue& a, const XlaValue& b) { return xla::Add(a.op_, b.op_); }
  friend XlaValue operator-(const XlaValue& a, const XlaValue& b) { return xla::Sub(a.op_, b.op_); }
  friend XlaValue operator*(const XlaValue& a, const XlaValue& b) { return xla::Mul(a.op_, b.op_); }
  friend XlaValue operator/(const XlaValue& a, const XlaValue& b) {
    switch (b.kind_) {
      case Kind::kSqrt:
        return xla::Neg(xla::Div(a.op_, xla::Neg(b.op_)));
      case Kind::kLiteral:
        return xla::Div(a.op_, xla::OptimizationBarrier(b.op_));
      default:
        return xla::Div(a.op_, b.op_);
    }
  }
  friend XlaValue operator-(const XlaValue& a) { return xla::Neg(a.op_); }
  XlaValue& operator+=(const XlaValue& b) { return *this = *this + b; }
  XlaValue& operator-=(const XlaValue& b) { return *this = *this - b; }
  XlaValue& operator*=(const XlaValue& b) { return *this = *this * b; }
  XlaValue& operator/=(const XlaValue& b) { return *this = *this / b; }

  friend XlaValue Sqrt(const XlaValue& x);

 private:
  // What operator/ needs to know of a divisor.
  enum class Kind { kOther, kLiteral, kSqrt };
  XlaValue(xla::XlaOp op, Kind kind) : op_(op), kind_(kind) {}
  static xla::XlaOp Constant(double value);
  xla::XlaOp op_;
  Kind kind_ = Kind::kOther;
};

// The builder and compute type literals belong to, for the current thread.
class XlaValueScope {
 public:
  XlaValueScope(xla::XlaBuilder* builder, xla::PrimitiveType type)
      : builder_(builder), type_(type), outer_(current_) {
    current_ = this;
  }
  ~XlaValueScope() { current_ = outer_; }
  XlaValueScope(const XlaValueScope&) = delete;
  XlaValueScope& operator=(const XlaValueScope&) = delete;

 private:
  friend class XlaValue;
  xla::XlaBuilder* builder_;
  xla::PrimitiveType type_;
  XlaValueScope* outer_;
  static inline thread_local XlaValueScope* current_ = nullptr;
};

inline xla::XlaOp XlaValue::Constant(double value) {
  const XlaValueScope* scope = XlaValueScope::current_;
  return xla::ConstantR0WithType(scope->builder_, scope->type_, value);
}

// The math the rules call (numeric.h has the float/double overloads).
inline XlaValue Sqrt(const XlaValue& x) {
  return XlaValue(xla::Sqrt(x.op()), XlaValue::Kind::kSqrt);
}
inline XlaValue Abs(const XlaValue& x) { return xla::Abs(x.op()); }
// numeric.h's (a != a || a > b) ? a : b, element-wise: the same pick for NaN and +-0.
inline XlaValue MaxPropagateNaN(const XlaValue& a, const XlaValue& b) {
  return xla::Select(xla::Or(xla::Ne(a.op(), a.op()), xla::Gt(a.op(), b.op())), a.op(), b.op());
}

}  // namespace tf
}  // namespace fusedopt
