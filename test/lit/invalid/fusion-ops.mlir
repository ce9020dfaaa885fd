// The verifiers of fusion ops: shapes, element types, axes and contractions.
// RUN: hir-opt %s --split-input-file --verify-diagnostics

func.func @set_shape(%x: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{result shape [8, 4] does not match the shape [4, 8] that the operands give}}
  %y = fusion.set %x : !fusion.tensor<[4, 8], f32> -> !fusion.tensor<[8, 4], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @set_element_type(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{result element type bf16 differs from the expected f32}}
  %y = fusion.set %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], bf16>
  func.return
}

// -----

func.func @unary_shape(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{result shape [4, 1] does not match the shape [4] that the operands give}}
  %y = fusion.exp %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4, 1], f32>
  func.return
}

// -----

func.func @unary_element_type(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{result element type f16 differs from the expected f32}}
  %y = fusion.sqrt %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f16>
  func.return
}

// -----

func.func @binary_broadcast(%a: !fusion.tensor<[4, 3], f32>, %b: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{shapes [4, 3], [4] do not broadcast: axis 1 of the result would need extents [3, 4]}}
  %y = fusion.add %a, %b : (!fusion.tensor<[4, 3], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[4, 3], f32>
  func.return
}

// -----

func.func @binary_shape(%a: !fusion.tensor<[4, 1], f32>, %b: !fusion.tensor<[3], f32>) {
  // expected-error@+1 {{result shape [4, 1] does not match the shape [4, 3] that the operands give}}
  %y = fusion.mul %a, %b : (!fusion.tensor<[4, 1], f32>, !fusion.tensor<[3], f32>) -> !fusion.tensor<[4, 1], f32>
  func.return
}

// -----

func.func @binary_element_types(%a: !fusion.tensor<[4], f32>, %b: !fusion.tensor<[4], bf16>) {
  // expected-error@+1 {{operands have element types f32 and bf16; insert a fusion.cast to make them equal}}
  %y = fusion.maximum %a, %b : (!fusion.tensor<[4], f32>, !fusion.tensor<[4], bf16>) -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @constant_type() {
  // expected-error@+1 {{constant of type f32 cannot produce a tensor of i64}}
  %c = fusion.constant 1.0 : f32 : !fusion.tensor<[], i64>
  func.return
}

// -----

func.func @constant_shape() {
  // expected-error@+1 {{result shape [4] does not match the shape [] that the operands give}}
  %c = fusion.constant 1.0 : f32 : !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @cast_shape(%x: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{result shape [2, 4] does not match the shape [4, 2] that the operands give}}
  %y = fusion.cast %x : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[2, 4], bf16>
  func.return
}

// -----

func.func @reduction_axis_out_of_range(%x: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{reduction axis 2 is out of range for a tensor of rank 2}}
  %y = fusion.sum %x [2] : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @reduction_axis_repeated(%x: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{reduction axes [1, -1] name an axis twice}}
  %y = fusion.max %x [1, -1] : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @reduction_no_axes(%x: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{a reduction needs at least one axis}}
  %y = fusion.sum %x [] : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @reduction_shape(%x: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{result shape [4] does not match the shape [4, 1] that the operands give}}
  %y = fusion.sum %x [1] keepdim : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @broadcast_no_axes(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{a broadcast needs at least one new axis}}
  %y = fusion.broadcast %x [] : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @broadcast_axis_out_of_range(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{broadcast axis 3 is out of range for a tensor of rank 2}}
  %y = fusion.broadcast %x [3] : !fusion.tensor<[4], f32> -> !fusion.tensor<[4, 1], f32>
  func.return
}

// -----

func.func @broadcast_shape(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{result shape [4, 1] does not match the shape [1, 4] that the operands give}}
  %y = fusion.broadcast %x [0] : !fusion.tensor<[4], f32> -> !fusion.tensor<[4, 1], f32>
  func.return
}

// -----

func.func @matmul_contraction(%a: !fusion.tensor<[4, 8], f32>, %b: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{matmul contracts axis of extent 8 of [4, 8] with extent 4 of [4, 8]; they must be equal}}
  %y = fusion.matmul %a, %b : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32>
  func.return
}

// -----

func.func @matmul_scalar(%a: !fusion.tensor<[], f32>, %b: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{matmul operands must have rank at least 1}}
  %y = fusion.matmul %a, %b : (!fusion.tensor<[], f32>, !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[8], f32>
  func.return
}

// -----

func.func @matmul_batch(%a: !fusion.tensor<[2, 4, 8], f32>, %b: !fusion.tensor<[3, 8, 4], f32>) {
  // expected-error@+1 {{shapes [2], [3] do not broadcast}}
  %y = fusion.matmul %a, %b : (!fusion.tensor<[2, 4, 8], f32>, !fusion.tensor<[3, 8, 4], f32>) -> !fusion.tensor<[2, 4, 4], f32>
  func.return
}

// -----

func.func @matmul_shape(%a: !fusion.tensor<[4, 8], f32>, %b: !fusion.tensor<[8, 2], f32>) {
  // expected-error@+1 {{result shape [4, 8] does not match the shape [4, 2] that the operands give}}
  %y = fusion.matmul %a, %b : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[8, 2], f32>) -> !fusion.tensor<[4, 8], f32>
  func.return
}

// -----

func.func @matmul_bias(%a: !fusion.tensor<[4, 8], f32>, %b: !fusion.tensor<[8, 2], f32>, %bias: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{matmul bias [4] does not broadcast to the product [4, 2]}}
  %y = fusion.matmul %a, %b, %bias : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[8, 2], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @matmul_bias_rank(%a: !fusion.tensor<[4, 8], f32>, %b: !fusion.tensor<[8, 2], f32>, %bias: !fusion.tensor<[3, 4, 2], f32>) {
  // expected-error@+1 {{matmul bias [3, 4, 2] does not broadcast to the product [4, 2]}}
  %y = fusion.matmul %a, %b, %bias : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[8, 2], f32>, !fusion.tensor<[3, 4, 2], f32>) -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @matmul_element_types(%a: !fusion.tensor<[4, 8], f32>, %b: !fusion.tensor<[8, 2], bf16>) {
  // expected-error@+1 {{operands have element types f32, bf16; they must be equal}}
  %y = fusion.matmul %a, %b : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[8, 2], bf16>) -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @linear_weight_rank(%x: !fusion.tensor<[4, 8], f32>, %w: !fusion.tensor<[2, 2, 8], f32>) {
  // expected-error@+1 {{linear weight must have rank 1 or 2, got [2, 2, 8]}}
  %y = fusion.linear %x, %w : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[2, 2, 8], f32>) -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @linear_contraction(%x: !fusion.tensor<[4, 8], f32>, %w: !fusion.tensor<[8, 4], f32>) {
  // expected-error@+1 {{linear contracts the last axis of the input [4, 8] with the last axis of the weight [8, 4]; their extents must be equal}}
  %y = fusion.linear %x, %w : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[8, 4], f32>) -> !fusion.tensor<[4, 8], f32>
  func.return
}

// -----

func.func @linear_bias_rank(%x: !fusion.tensor<[4, 8], f32>, %w: !fusion.tensor<[2, 8], f32>, %b: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{linear bias must have rank 0 or 1, got [4, 2]}}
  %y = fusion.linear %x, %w, %b : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[2, 8], f32>, !fusion.tensor<[4, 2], f32>) -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @linear_bias_extent(%x: !fusion.tensor<[4, 8], f32>, %w: !fusion.tensor<[2, 8], f32>, %b: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{linear bias [4] does not broadcast to the result [4, 2]}}
  %y = fusion.linear %x, %w, %b : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[2, 8], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @linear_shape(%x: !fusion.tensor<[?, 4, 8], f32>, %w: !fusion.tensor<[2, 8], f32>) {
  // expected-error@+1 {{result shape [?, 4, 8] does not match the shape [?, 4, 2] that the operands give}}
  %y = fusion.linear %x, %w : (!fusion.tensor<[?, 4, 8], f32>, !fusion.tensor<[2, 8], f32>) -> !fusion.tensor<[?, 4, 8], f32>
  func.return
}

// -----

func.func @linear_element_types(%x: !fusion.tensor<[4, 8], f32>, %w: !fusion.tensor<[2, 8], f32>, %b: !fusion.tensor<[2], f16>) {
  // expected-error@+1 {{operands have element types f32, f32, f16; they must be equal}}
  %y = fusion.linear %x, %w, %b : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[2, 8], f32>, !fusion.tensor<[2], f16>) -> !fusion.tensor<[4, 2], f32>
  func.return
}

// -----

func.func @operand_not_a_tensor(%i: index) {
  // expected-error@+1 {{index should be of base attribute fusion.tensor}}
  %y = "fusion.neg"(%i) : (index) -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @aten_returns_count(%x: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{aten.max.dim: 'returns' names 2 of ATen's results, but the op has 1 result}}
  %y = fusion.aten "aten.max.dim"(%x) call "[[{'operand': 0}, 1], {}]" returns [0, 1] : (!fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @aten_returns_repeated(%x: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{aten.max.dim: the positions in 'returns' must be distinct and not negative}}
  %y:2 = fusion.aten "aten.max.dim"(%x) call "[[{'operand': 0}, 1], {}]" returns [0, 0] : (!fusion.tensor<[4, 8], f32>) -> (!fusion.tensor<[4], f32>, !fusion.tensor<[4], f32>)
  func.return
}

// -----

func.func @aten_returns_negative(%x: !fusion.tensor<[4, 8], f32>) {
  // expected-error@+1 {{aten.max.dim: the positions in 'returns' must be distinct and not negative}}
  %y = fusion.aten "aten.max.dim"(%x) call "[[{'operand': 0}, 1], {}]" returns [-1] : (!fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @rotate_half_odd(%x: !fusion.tensor<[4, 7], f32>) {
  // expected-error@+1 {{the last axis has extent 7; its two halves swap, so it must be even}}
  %y = fusion.rotate_half %x : !fusion.tensor<[4, 7], f32> -> !fusion.tensor<[4, 7], f32>
  func.return
}

// -----

func.func @rotate_half_sharded_last_axis(%x: !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]>) {
  // expected-error@+1 {{the operand's last axis is didx; the halves of the axis a rotation swaps must be on one device and stream (`_`)}}
  %y = fusion.rotate_half %x : !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]> -> !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]>
  func.return
}
