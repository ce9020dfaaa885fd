// RUN: not hir-opt --split-input-file %s -p hir-lowering 2>&1 | filecheck %s

// Fusions that no stream pipeline covers: hir-lowering stops with a message that
// names the op, the axis and the sharding of the operand at fault.

// A sum over its stream axis: each iteration would hold a partial sum.
// CHECK: error: {{.*}}hir.reduction reduces axis 1 of operand 0 `input` (input #0 of @sum_over_stream) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>, which is that operand's stream axis; a reduced axis cannot be stream-parallel

func.func @sum_over_stream(%x: !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?], f32> {
  %y = fusion.sum %x [1] : !fusion.tensor<[?, ?], f32, axes = [_, stream]> -> !fusion.tensor<[?], f32>
  func.return %y : !fusion.tensor<[?], f32>
}

// -----

// A matmul whose lhs streams its K axis.
// CHECK: error: {{.*}}hir.matmul contracts axis 1 of operand 0 `lhs` (input #0 of @matmul_k) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>, which is that operand's stream axis

func.func @matmul_k(%a: !fusion.tensor<[?, ?], f32, axes = [_, stream]>, %b: !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?, ?], f32> {
  %c = fusion.matmul %a, %b : (!fusion.tensor<[?, ?], f32, axes = [_, stream]>, !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?, ?], f32>
  func.return %c : !fusion.tensor<[?, ?], f32>
}

// -----

// A linear whose weight streams its K axis.
// CHECK: error: {{.*}}hir.linear contracts axis 1 of operand 1 `weight` (input #1 of @linear_k) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>, which is that operand's stream axis

func.func @linear_k(%a: !fusion.tensor<[?, ?], f32>, %w: !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %c = fusion.linear %a, %w : (!fusion.tensor<[?, ?], f32>, !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  func.return %c : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}

// -----

// Operands streamed along different axes of the output (fused into one kernel).
// CHECK: error: {{.*}}the stream axes of the operands of hir.launch_kernel map to different axes [0, 1] of its output !fusion.tensor<[?, ?], f32, axes = [stream, _]>: axis 0 from operand 0 `ins[0]` (input #0 of @different) of type !fusion.tensor<[?, ?], f32, axes = [stream, _]>; axis 1 from operand 1 `ins[1]` (input #1 of @different) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>

func.func @different(%x: !fusion.tensor<[?, ?], f32, axes = [stream, _]>, %y: !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %z = fusion.add %x, %y : (!fusion.tensor<[?, ?], f32, axes = [stream, _]>, !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  func.return %z : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}

// -----

// A point-to-point allgather over a mesh whose devices are not consecutive.
// CHECK: error: {{.*}}the point-to-point allgather of hir.allgather from operand 0 `input` ({{.*}}) of type !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]> needs a mesh of consecutive devices

func.func @p2p_sparse(%a: !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]>) -> !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [stream, _]> {
  %c = fusion.set %a : !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]> -> !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [stream, _]>
  func.return %c : !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [stream, _]>
}

// -----

// A kernel that ties both axes of its output to one axis of %y:
// out[i, j] = x[i, j] + y[j] + y[i].
// CHECK: error: {{.*}}segment @kernel_tied_segment_0 relates two axes of its output !fusion.tensor<[?, ?], f32, axes = [stream, _]> to each other

func.func @kernel_tied(%x: !fusion.tensor<[?, ?], f32>, %y: !fusion.tensor<[?], f32>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %a = fusion.add %x, %y : (!fusion.tensor<[?, ?], f32>, !fusion.tensor<[?], f32>) -> !fusion.tensor<[?, ?], f32>
  %w = fusion.broadcast %y [1] : !fusion.tensor<[?], f32> -> !fusion.tensor<[?, 1], f32>
  %b = fusion.add %a, %w : (!fusion.tensor<[?, ?], f32>, !fusion.tensor<[?, 1], f32>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  func.return %b : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}
