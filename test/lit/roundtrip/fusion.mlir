// Round trip of the fusion dialect: the !fusion.tensor type (every element type,
// static and dynamic extents, meshes, parallel types), the mesh and parallel-type
// attributes and every op. Each is checked in the custom form and in the generic form
// (--print-op-generic), and both forms are fixed points of hir-opt, the generic one
// also when printed back in the custom form.
// RUN: hir-opt %s | filecheck %s
// RUN: hir-opt %s | hir-opt | filecheck %s
// RUN: hir-opt --print-op-generic %s | hir-opt | filecheck %s
// RUN: hir-opt --print-op-generic %s | filecheck %s --check-prefix=GENERIC
// RUN: hir-opt --print-op-generic %s | hir-opt --print-op-generic | filecheck %s --check-prefix=GENERIC

// ====================================================================================
// Types (one syntax, so the generic form prints them the same way)
// ====================================================================================

// CHECK-LABEL: func.func @element_types(
// CHECK-SAME: %f64: !fusion.tensor<[2], f64>, %f32: !fusion.tensor<[2], f32>, %f16: !fusion.tensor<[2], f16>, %bf16: !fusion.tensor<[2], bf16>,
// CHECK-SAME: %i64: !fusion.tensor<[2], i64>, %i32: !fusion.tensor<[2], i32>, %i8: !fusion.tensor<[2], i8>, %i1: !fusion.tensor<[2], i1>) {
// GENERIC-LABEL: "func.func"() <{sym_name = "element_types", function_type = (
// GENERIC-SAME: !fusion.tensor<[2], f64>, !fusion.tensor<[2], f32>, !fusion.tensor<[2], f16>, !fusion.tensor<[2], bf16>,
// GENERIC-SAME: !fusion.tensor<[2], i64>, !fusion.tensor<[2], i32>, !fusion.tensor<[2], i8>, !fusion.tensor<[2], i1>) -> ()}> ({
// GENERIC-NEXT: ^bb0(%f64: !fusion.tensor<[2], f64>, %f32: !fusion.tensor<[2], f32>,
func.func @element_types(%f64: !fusion.tensor<[2], f64>, %f32: !fusion.tensor<[2], f32>,
                         %f16: !fusion.tensor<[2], f16>, %bf16: !fusion.tensor<[2], bf16>,
                         %i64: !fusion.tensor<[2], i64>, %i32: !fusion.tensor<[2], i32>,
                         %i8: !fusion.tensor<[2], i8>, %i1: !fusion.tensor<[2], i1>) {
  func.return
}

// The default mesh [0] and all-serial axes are not printed; `?` is a dynamic extent;
// a didx axis spans the mesh (static extent = mesh size, or `?`).
// CHECK-LABEL: func.func @shapes(
// CHECK-SAME: %scalar: !fusion.tensor<[], f32>,
// CHECK-SAME: %dynamic: !fusion.tensor<[?, 4, ?], f32>,
// CHECK-SAME: %default_mesh: !fusion.tensor<[4, 2], f32>,
// CHECK-SAME: %mesh: !fusion.tensor<[4], f32, mesh = [3, 1, 2]>,
// CHECK-SAME: %sharded: !fusion.tensor<[?, 4], bf16, mesh = [0, 1, 2, 3], axes = [stream, didx]>,
// CHECK-SAME: %dynamic_didx: !fusion.tensor<[?, 8], f16, mesh = [4, 5], axes = [didx, _]>,
// CHECK-SAME: %inner_stream: !fusion.tensor<[4, 8], f32, axes = [_, stream]>) {
// GENERIC-LABEL: "func.func"() <{sym_name = "shapes", function_type = (
// GENERIC-SAME: !fusion.tensor<[], f32>, !fusion.tensor<[?, 4, ?], f32>, !fusion.tensor<[4, 2], f32>,
// GENERIC-SAME: !fusion.tensor<[4], f32, mesh = [3, 1, 2]>,
// GENERIC-SAME: !fusion.tensor<[?, 4], bf16, mesh = [0, 1, 2, 3], axes = [stream, didx]>,
// GENERIC-SAME: !fusion.tensor<[?, 8], f16, mesh = [4, 5], axes = [didx, _]>,
// GENERIC-SAME: !fusion.tensor<[4, 8], f32, axes = [_, stream]>) -> ()}>
func.func @shapes(%scalar: !fusion.tensor<[], f32>,
                  %dynamic: !fusion.tensor<[?, 4, ?], f32>,
                  %default_mesh: !fusion.tensor<[4, 2], f32, mesh = [0], axes = [_, _]>,
                  %mesh: !fusion.tensor<[4], f32, mesh = [3, 1, 2], axes = [_]>,
                  %sharded: !fusion.tensor<[?, 4], bf16, mesh = [0, 1, 2, 3], axes = [stream, didx]>,
                  %dynamic_didx: !fusion.tensor<[?, 8], f16, mesh = [4, 5], axes = [didx, _]>,
                  %inner_stream: !fusion.tensor<[4, 8], f32, axes = [_, stream]>) {
  func.return
}

// ====================================================================================
// fusion.set, unary and binary pointwise ops, fusion.constant, fusion.cast
// ====================================================================================

// CHECK-LABEL: func.func @set(
// CHECK-NEXT: %resharded = fusion.set %x : !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
// CHECK-NEXT: %moved = fusion.set %resharded {tag} : !fusion.tensor<[2, 8], f32, mesh = [0, 1]> -> !fusion.tensor<[2, 8], f32, mesh = [2, 3]>
// GENERIC-LABEL: sym_name = "set"
// GENERIC: %resharded = "fusion.set"(%x) : (!fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
// GENERIC-NEXT: %moved = "fusion.set"(%resharded) {tag} : (!fusion.tensor<[2, 8], f32, mesh = [0, 1]>) -> !fusion.tensor<[2, 8], f32, mesh = [2, 3]>
func.func @set(%x: !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]>) {
  %resharded = fusion.set %x : !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
  %moved = fusion.set %resharded {tag} : !fusion.tensor<[2, 8], f32, mesh = [0, 1]> -> !fusion.tensor<[2, 8], f32, mesh = [2, 3]>
  func.return
}

// CHECK-LABEL: func.func @unary(
// CHECK-NEXT: %neg = fusion.neg %x : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
// CHECK-NEXT: %abs = fusion.abs %neg : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
// CHECK-NEXT: %exp = fusion.exp %abs : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
// CHECK-NEXT: %log = fusion.log %exp : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
// CHECK-NEXT: %sqrt = fusion.sqrt %log : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
// CHECK-NEXT: %relu = fusion.relu %sqrt : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
// CHECK-NEXT: %tanh = fusion.tanh %relu : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
// CHECK-NEXT: %sigmoid = fusion.sigmoid %tanh : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[4, 8], bf16>
// GENERIC-LABEL: sym_name = "unary"
// GENERIC: %neg = "fusion.neg"(%x) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], bf16>
// GENERIC-NEXT: %abs = "fusion.abs"(%neg) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], bf16>
// GENERIC-NEXT: %exp = "fusion.exp"(%abs) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], bf16>
// GENERIC-NEXT: %log = "fusion.log"(%exp) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], bf16>
// GENERIC-NEXT: %sqrt = "fusion.sqrt"(%log) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], bf16>
// GENERIC-NEXT: %relu = "fusion.relu"(%sqrt) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], bf16>
// GENERIC-NEXT: %tanh = "fusion.tanh"(%relu) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], bf16>
// GENERIC-NEXT: %sigmoid = "fusion.sigmoid"(%tanh) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[4, 8], bf16>
func.func @unary(%x: !fusion.tensor<[?, 8], bf16>) {
  %neg = fusion.neg %x : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
  %abs = fusion.abs %neg : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
  %exp = fusion.exp %abs : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
  %log = fusion.log %exp : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
  %sqrt = fusion.sqrt %log : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
  %relu = fusion.relu %sqrt : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
  %tanh = fusion.tanh %relu : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], bf16>
  %sigmoid = fusion.sigmoid %tanh : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[4, 8], bf16>
  func.return
}

// Binary ops broadcast as torch does: [4, 1, 8] with [3, 1] gives [4, 3, 8].
// CHECK-LABEL: func.func @binary(
// CHECK-NEXT: %add = fusion.add %a, %b : (!fusion.tensor<[4, 1, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// CHECK-NEXT: %sub = fusion.sub %add, %b : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// CHECK-NEXT: %mul = fusion.mul %sub, %sub : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 3, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// CHECK-NEXT: %div = fusion.div %mul, %a : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 1, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// CHECK-NEXT: %maximum = fusion.maximum %div, %mul : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 3, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// CHECK-NEXT: %minimum = fusion.minimum %maximum, %b : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// CHECK-NEXT: %pow = fusion.pow %minimum, %two : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// GENERIC-LABEL: sym_name = "binary"
// GENERIC: %add = "fusion.add"(%a, %b) : (!fusion.tensor<[4, 1, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// GENERIC-NEXT: %sub = "fusion.sub"(%add, %b) : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// GENERIC-NEXT: %mul = "fusion.mul"(%sub, %sub) : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 3, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// GENERIC-NEXT: %div = "fusion.div"(%mul, %a) : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 1, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// GENERIC-NEXT: %maximum = "fusion.maximum"(%div, %mul) : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 3, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// GENERIC-NEXT: %minimum = "fusion.minimum"(%maximum, %b) : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
// GENERIC-NEXT: %pow = "fusion.pow"(%minimum, %two) : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[], f32>) -> !fusion.tensor<[4, 3, 8], f32>
func.func @binary(%a: !fusion.tensor<[4, 1, 8], f32>, %b: !fusion.tensor<[3, 1], f32>, %two: !fusion.tensor<[], f32>) {
  %add = fusion.add %a, %b : (!fusion.tensor<[4, 1, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
  %sub = fusion.sub %add, %b : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
  %mul = fusion.mul %sub, %sub : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 3, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
  %div = fusion.div %mul, %a : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 1, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
  %maximum = fusion.maximum %div, %mul : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[4, 3, 8], f32>) -> !fusion.tensor<[4, 3, 8], f32>
  %minimum = fusion.minimum %maximum, %b : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[3, 1], f32>) -> !fusion.tensor<[4, 3, 8], f32>
  %pow = fusion.pow %minimum, %two : (!fusion.tensor<[4, 3, 8], f32>, !fusion.tensor<[], f32>) -> !fusion.tensor<[4, 3, 8], f32>
  func.return
}

// CHECK-LABEL: func.func @constant_and_cast(
// CHECK-NEXT: %half = fusion.constant 5.000000e-01 : f32 : !fusion.tensor<[], f32>
// CHECK-NEXT: %three = fusion.constant 3 : i64 : !fusion.tensor<[], i64>
// CHECK-NEXT: %yes = fusion.constant true : !fusion.tensor<[], i1>
// CHECK-NEXT: %sharded = fusion.constant 2.000000e+00 : bf16 : !fusion.tensor<[], bf16, mesh = [0, 1]>
// CHECK-NEXT: %wide = fusion.cast %x : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], f32>
// CHECK-NEXT: %int = fusion.cast %wide : !fusion.tensor<[?, 8], f32> -> !fusion.tensor<[?, 8], i32>
// GENERIC-LABEL: sym_name = "constant_and_cast"
// GENERIC: %half = "fusion.constant"() <{value = 5.000000e-01 : f32}> : () -> !fusion.tensor<[], f32>
// GENERIC-NEXT: %three = "fusion.constant"() <{value = 3 : i64}> : () -> !fusion.tensor<[], i64>
// GENERIC-NEXT: %yes = "fusion.constant"() <{value = true}> : () -> !fusion.tensor<[], i1>
// GENERIC-NEXT: %sharded = "fusion.constant"() <{value = 2.000000e+00 : bf16}> : () -> !fusion.tensor<[], bf16, mesh = [0, 1]>
// GENERIC-NEXT: %wide = "fusion.cast"(%x) : (!fusion.tensor<[?, 8], bf16>) -> !fusion.tensor<[?, 8], f32>
// GENERIC-NEXT: %int = "fusion.cast"(%wide) : (!fusion.tensor<[?, 8], f32>) -> !fusion.tensor<[?, 8], i32>
func.func @constant_and_cast(%x: !fusion.tensor<[?, 8], bf16>) {
  %half = fusion.constant 0.5 : f32 : !fusion.tensor<[], f32>
  %three = fusion.constant 3 : i64 : !fusion.tensor<[], i64>
  %yes = fusion.constant true : !fusion.tensor<[], i1>
  %sharded = fusion.constant 2.0 : bf16 : !fusion.tensor<[], bf16, mesh = [0, 1]>
  %wide = fusion.cast %x : !fusion.tensor<[?, 8], bf16> -> !fusion.tensor<[?, 8], f32>
  %int = fusion.cast %wide : !fusion.tensor<[?, 8], f32> -> !fusion.tensor<[?, 8], i32>
  func.return
}

// ====================================================================================
// Reductions, fusion.broadcast, fusion.matmul, fusion.linear
// ====================================================================================

// Axes are kept as written (negative axes count from the end).
// CHECK-LABEL: func.func @reductions(
// CHECK-NEXT: %sum = fusion.sum %x [1] : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[?, 4], f32>
// CHECK-NEXT: %sum_kept = fusion.sum %x [0, 2] keepdim : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[1, 8, 1], f32>
// CHECK-NEXT: %max = fusion.max %x [-1] : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[?, 8], f32>
// CHECK-NEXT: %max_kept = fusion.max %x [1] keepdim {tag} : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[?, 1, 4], f32>
// CHECK-NEXT: %sharded = fusion.sum %y [1] : !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]> -> !fusion.tensor<[4], f32, mesh = [0, 1]>
// GENERIC-LABEL: sym_name = "reductions"
// GENERIC: %sum = "fusion.sum"(%x) <{axes = array<i64: 1>}> : (!fusion.tensor<[?, 8, 4], f32>) -> !fusion.tensor<[?, 4], f32>
// GENERIC-NEXT: %sum_kept = "fusion.sum"(%x) <{axes = array<i64: 0, 2>, keepdim}> : (!fusion.tensor<[?, 8, 4], f32>) -> !fusion.tensor<[1, 8, 1], f32>
// GENERIC-NEXT: %max = "fusion.max"(%x) <{axes = array<i64: -1>}> : (!fusion.tensor<[?, 8, 4], f32>) -> !fusion.tensor<[?, 8], f32>
// GENERIC-NEXT: %max_kept = "fusion.max"(%x) <{axes = array<i64: 1>, keepdim}> {tag} : (!fusion.tensor<[?, 8, 4], f32>) -> !fusion.tensor<[?, 1, 4], f32>
// GENERIC-NEXT: %sharded = "fusion.sum"(%y) <{axes = array<i64: 1>}> : (!fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]>) -> !fusion.tensor<[4], f32, mesh = [0, 1]>
func.func @reductions(%x: !fusion.tensor<[?, 8, 4], f32>, %y: !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]>) {
  %sum = fusion.sum %x [1] : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[?, 4], f32>
  %sum_kept = fusion.sum %x [0, 2] keepdim : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[1, 8, 1], f32>
  %max = fusion.max %x [-1] : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[?, 8], f32>
  %max_kept = fusion.max %x [1] keepdim {tag} : !fusion.tensor<[?, 8, 4], f32> -> !fusion.tensor<[?, 1, 4], f32>
  %sharded = fusion.sum %y [1] : !fusion.tensor<[4, 2], f32, mesh = [0, 1], axes = [_, didx]> -> !fusion.tensor<[4], f32, mesh = [0, 1]>
  func.return
}

// CHECK-LABEL: func.func @broadcast(
// CHECK-NEXT: %row = fusion.broadcast %v [0] : !fusion.tensor<[8], f32> -> !fusion.tensor<[1, 8], f32>
// CHECK-NEXT: %spread = fusion.broadcast %v [0, 2] {tag} : !fusion.tensor<[8], f32> -> !fusion.tensor<[1, 8, 1], f32>
// GENERIC-LABEL: sym_name = "broadcast"
// GENERIC: %row = "fusion.broadcast"(%v) <{new_axes = array<i64: 0>}> : (!fusion.tensor<[8], f32>) -> !fusion.tensor<[1, 8], f32>
// GENERIC-NEXT: %spread = "fusion.broadcast"(%v) <{new_axes = array<i64: 0, 2>}> {tag} : (!fusion.tensor<[8], f32>) -> !fusion.tensor<[1, 8, 1], f32>
func.func @broadcast(%v: !fusion.tensor<[8], f32>) {
  %row = fusion.broadcast %v [0] : !fusion.tensor<[8], f32> -> !fusion.tensor<[1, 8], f32>
  %spread = fusion.broadcast %v [0, 2] {tag} : !fusion.tensor<[8], f32> -> !fusion.tensor<[1, 8, 1], f32>
  func.return
}

// torch.matmul shapes: 2-D, batched with broadcast batch axes, vector operands; with a
// bias (an optional operand, broadcast to the product: torch.addmm).
// CHECK-LABEL: func.func @matmul(
// CHECK-NEXT: %mm = fusion.matmul %a, %b : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[?, 32], bf16>
// CHECK-NEXT: %bmm = fusion.matmul %batched, %b : (!fusion.tensor<[3, 4, 16], bf16>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[3, 4, 32], bf16>
// CHECK-NEXT: %mv = fusion.matmul %b, %vec : (!fusion.tensor<[16, 32], bf16>, !fusion.tensor<[32], bf16>) -> !fusion.tensor<[16], bf16>
// CHECK-NEXT: %stream = fusion.matmul %s, %b : (!fusion.tensor<[4, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[4, 32], bf16, mesh = [0, 1], axes = [stream, _]>
// CHECK-NEXT: %addmm = fusion.matmul %batched, %b, %vec : (!fusion.tensor<[3, 4, 16], bf16>, !fusion.tensor<[16, 32], bf16>, !fusion.tensor<[32], bf16>) -> !fusion.tensor<[3, 4, 32], bf16>
// GENERIC-LABEL: sym_name = "matmul"
// GENERIC: %mm = "fusion.matmul"(%a, %b) : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[?, 32], bf16>
// GENERIC-NEXT: %bmm = "fusion.matmul"(%batched, %b) : (!fusion.tensor<[3, 4, 16], bf16>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[3, 4, 32], bf16>
// GENERIC-NEXT: %mv = "fusion.matmul"(%b, %vec) : (!fusion.tensor<[16, 32], bf16>, !fusion.tensor<[32], bf16>) -> !fusion.tensor<[16], bf16>
// GENERIC-NEXT: %stream = "fusion.matmul"(%s, %b) : (!fusion.tensor<[4, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[4, 32], bf16, mesh = [0, 1], axes = [stream, _]>
// GENERIC-NEXT: %addmm = "fusion.matmul"(%batched, %b, %vec) : (!fusion.tensor<[3, 4, 16], bf16>, !fusion.tensor<[16, 32], bf16>, !fusion.tensor<[32], bf16>) -> !fusion.tensor<[3, 4, 32], bf16>
func.func @matmul(%a: !fusion.tensor<[?, 16], bf16>, %b: !fusion.tensor<[16, 32], bf16>,
                  %batched: !fusion.tensor<[3, 4, 16], bf16>, %vec: !fusion.tensor<[32], bf16>,
                  %s: !fusion.tensor<[4, 16], bf16, mesh = [0, 1]>) {
  %mm = fusion.matmul %a, %b : (!fusion.tensor<[?, 16], bf16>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[?, 32], bf16>
  %bmm = fusion.matmul %batched, %b : (!fusion.tensor<[3, 4, 16], bf16>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[3, 4, 32], bf16>
  %mv = fusion.matmul %b, %vec : (!fusion.tensor<[16, 32], bf16>, !fusion.tensor<[32], bf16>) -> !fusion.tensor<[16], bf16>
  %stream = fusion.matmul %s, %b : (!fusion.tensor<[4, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[16, 32], bf16>) -> !fusion.tensor<[4, 32], bf16, mesh = [0, 1], axes = [stream, _]>
  %addmm = fusion.matmul %batched, %b, %vec : (!fusion.tensor<[3, 4, 16], bf16>, !fusion.tensor<[16, 32], bf16>, !fusion.tensor<[32], bf16>) -> !fusion.tensor<[3, 4, 32], bf16>
  func.return
}

// fusion.linear with and without a bias; the bias is an optional operand.
// CHECK-LABEL: func.func @linear(
// CHECK-NEXT: %biased = fusion.linear %x, %w, %bias : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[16, 4], f32>, !fusion.tensor<[16], f32>) -> !fusion.tensor<[?, 8, 16], f32>
// CHECK-NEXT: %plain = fusion.linear %x, %w : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[16, 4], f32>) -> !fusion.tensor<[?, 8, 16], f32>
// CHECK-NEXT: %dot = fusion.linear %x, %v : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[?, 8], f32>
// GENERIC-LABEL: sym_name = "linear"
// GENERIC: %biased = "fusion.linear"(%x, %w, %bias) : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[16, 4], f32>, !fusion.tensor<[16], f32>) -> !fusion.tensor<[?, 8, 16], f32>
// GENERIC-NEXT: %plain = "fusion.linear"(%x, %w) : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[16, 4], f32>) -> !fusion.tensor<[?, 8, 16], f32>
// GENERIC-NEXT: %dot = "fusion.linear"(%x, %v) : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[?, 8], f32>
func.func @linear(%x: !fusion.tensor<[?, 8, 4], f32>, %w: !fusion.tensor<[16, 4], f32>,
                  %bias: !fusion.tensor<[16], f32>, %v: !fusion.tensor<[4], f32>) {
  %biased = fusion.linear %x, %w, %bias : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[16, 4], f32>, !fusion.tensor<[16], f32>) -> !fusion.tensor<[?, 8, 16], f32>
  %plain = fusion.linear %x, %w : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[16, 4], f32>) -> !fusion.tensor<[?, 8, 16], f32>
  %dot = fusion.linear %x, %v : (!fusion.tensor<[?, 8, 4], f32>, !fusion.tensor<[4], f32>) -> !fusion.tensor<[?, 8], f32>
  func.return
}

// ====================================================================================
// fusion.attention and fusion.attention_backward
// ====================================================================================

// Attention and its log-sum-exp (f32): keys in blocks with a causal layout of the sequence
// over the queries' mesh, a boolean or additive mask operand (broadcast), SDPA's top-left
// causal mask, a scale; the backward's gradients, each device's share of replicated keys
// with the device axis first.
// CHECK-LABEL: func.func @attention(
// CHECK-NEXT: %out, %lse = fusion.attention %q, %k, %k causal head_tail blocks : (!fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>) -> (!fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>)
// CHECK-NEXT: %masked, %masked_lse = fusion.attention %qf, %kf, %kf mask %m scale 2.500000e-01 : (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[8, 16], i1>) -> (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8], f32>)
// CHECK-NEXT: %added, %added_lse = fusion.attention %qf, %kf, %kf mask %a {tag} : (
// CHECK-NEXT: %causal, %causal_lse = fusion.attention %qf, %qf, %qf causal top_left : (
// CHECK-NEXT: %dq, %dk, %dv = fusion.attention_backward %out, %q, %k, %k, %out, %lse causal head_tail blocks : (
// CHECK-SAME: -> (!fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _, _]>, !fusion.tensor<[2, 2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _, _]>)
// CHECK-NEXT: %mdq, %mdk, %mdv = fusion.attention_backward %masked, %qf, %kf, %kf, %masked, %masked_lse mask %m scale 2.500000e-01 : (
// GENERIC-LABEL: sym_name = "attention"
// GENERIC: %out, %lse = "fusion.attention"(%q, %k, %k) <{causal = #fusion<causal head_tail>, blocks}> : (
// GENERIC-NEXT: %masked, %masked_lse = "fusion.attention"(%qf, %kf, %kf, %m) <{scale = 2.500000e-01 : f64}> : (
// GENERIC-NEXT: %added, %added_lse = "fusion.attention"(%qf, %kf, %kf, %a) {tag} : (
// GENERIC-NEXT: %causal, %causal_lse = "fusion.attention"(%qf, %qf, %qf) <{causal = #fusion<causal top_left>}> : (
// GENERIC-NEXT: %dq, %dk, %dv = "fusion.attention_backward"(%out, %q, %k, %k, %out, %lse) <{causal = #fusion<causal head_tail>, blocks}> : (
// GENERIC-NEXT: %mdq, %mdk, %mdv = "fusion.attention_backward"(%masked, %qf, %kf, %kf, %masked, %masked_lse, %m) <{scale = 2.500000e-01 : f64}> : (
func.func @attention(%q: !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>,
                     %k: !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>,
                     %kf: !fusion.tensor<[2, 4, 16, 16], bf16>, %qf: !fusion.tensor<[2, 4, 8, 16], bf16>,
                     %m: !fusion.tensor<[8, 16], i1>, %a: !fusion.tensor<[1, 8, 16], bf16>) {
  %out, %lse = fusion.attention %q, %k, %k causal head_tail blocks : (!fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>) -> (!fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>)
  %masked, %masked_lse = fusion.attention %qf, %kf, %kf mask %m scale 0.25 : (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[8, 16], i1>) -> (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8], f32>)
  %added, %added_lse = fusion.attention %qf, %kf, %kf mask %a {tag} : (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[1, 8, 16], bf16>) -> (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8], f32>)
  %causal, %causal_lse = fusion.attention %qf, %qf, %qf causal top_left : (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8, 16], bf16>) -> (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8], f32>)
  %dq, %dk, %dv = fusion.attention_backward %out, %q, %k, %k, %out, %lse causal head_tail blocks : (!fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1]>, !fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>) -> (!fusion.tensor<[2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, !fusion.tensor<[2, 2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _, _]>, !fusion.tensor<[2, 2, 2, 4, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _, _]>)
  %mdq, %mdk, %mdv = fusion.attention_backward %masked, %qf, %kf, %kf, %masked, %masked_lse mask %m scale 0.25 : (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 8], f32>, !fusion.tensor<[8, 16], i1>) -> (!fusion.tensor<[2, 4, 8, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>, !fusion.tensor<[2, 4, 16, 16], bf16>)
  func.return
}
