// A float literal beyond the largest finite value of its type is an error on the
// literal, in every float type and wherever a literal is read (an attribute, a
// constant, an alias, a dense array or tensor). The largest finite value is accepted,
// and so is infinity written in hexadecimal, as its bits.
// RUN: hir-opt %s --split-input-file --verify-diagnostics
// RUN: not hir-opt %s 2>&1 | filecheck %s --strict-whitespace -DFILE=%s

// CHECK: {{^}}[[FILE]]:[[# @LINE + 4]]:44: error: float literal 1.0e39 is out of range for type f32{{$}}
// CHECK-NEXT: {{^}}func.func @f32_attribute() attributes {a = 1.0e39 : f32} {{[{]}}
// CHECK-NEXT: {{^}}                                           ^^^^^^^^^^^^{{$}}
// expected-error@+1 {{float literal 1.0e39 is out of range for type f32}}
func.func @f32_attribute() attributes {a = 1.0e39 : f32} {
  func.return
}

// -----

// expected-error@+1 {{float literal -65520.0 is out of range for type f16}}
func.func @f16_attribute() attributes {a = -65520.0 : f16} {
  func.return
}

// -----

// expected-error@+1 {{float literal 1.0e39 is out of range for type bf16}}
func.func @bf16_attribute() attributes {a = 1.0e39 : bf16} {
  func.return
}

// -----

// expected-error@+1 {{float literal 1.0e309 is out of range for type f64}}
func.func @f64_attribute() attributes {a = 1.0e309 : f64} {
  func.return
}

// -----

// expected-error@+1 {{float literal 0x1FFFFFFFF is out of range for type f32}}
func.func @hexadecimal_with_too_many_bits() attributes {a = 0x1FFFFFFFF : f32} {
  func.return
}

// -----

func.func @constant() -> !fusion.tensor<[], f32> {
  // expected-error@+1 {{float literal 1.0e39 is out of range for type f32}}
  %c = fusion.constant 1.0e39 : f32 : !fusion.tensor<[], f32>
  func.return %c : !fusion.tensor<[], f32>
}

// -----

// expected-error@+1 {{float literal 1.0e39 is out of range for type f32}}
#alias = 1.0e39 : f32

// -----

// expected-error@+1 {{a value is out of its type's range (float too large to pack with f format)}}
#dense_array = array<f32: 1.0e39>

// -----

// expected-error@+1 {{a value is out of its type's range (float too large to pack with f format)}}
func.func @dense_tensor() attributes {a = dense<1.0e39> : tensor<2xf32>} {
  func.return
}

// -----

// The largest finite values, and infinity as bits, read.
func.func @at_the_bounds() attributes {
    f16 = 65504.0 : f16, bf16 = 3.38953139e38 : bf16, f32 = 3.40282347e38 : f32,
    f64 = 1.7976931348623157e308 : f64, infinity = 0x7F800000 : f32} {
  func.return
}
