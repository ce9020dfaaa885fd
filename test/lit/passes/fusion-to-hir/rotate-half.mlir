// RUN: hir-opt %s -p fusion-to-hir | filecheck %s

// A rotation joins the kernel of the ops around it, which reads its operand at the other
// half of the last axis: so its operand comes from memory, and a rotation of a value the
// kernel would compute starts a kernel of its own.

!x = !fusion.tensor<[4, 8], f32>

// The rotary embedding's forward: one kernel.
// CHECK-LABEL: func.func private @forward_segment_0(%x: !fusion.tensor<[4, 8], f32>, %c: {{.*}}, %s: {{.*}})
// CHECK-NEXT:    %r = fusion.rotate_half %x
// CHECK-LABEL: func.func @forward(
// CHECK-COUNT-1: hir.launch_kernel
// CHECK-NOT:     hir.launch_kernel
func.func @forward(%x: !x, %c: !x, %s: !x) -> !x {
  %r = fusion.rotate_half %x : !x -> !x
  %a = fusion.mul %x, %c : (!x, !x) -> !x
  %b = fusion.mul %r, %s : (!x, !x) -> !x
  %o = fusion.add %a, %b : (!x, !x) -> !x
  func.return %o : !x
}

// Its backward: g * sin is computed and stored first; the rotation reads it back.
// CHECK-LABEL: func.func private @backward_segment_0(
// CHECK-NOT:     fusion.rotate_half
// CHECK:         func.return
// CHECK-LABEL: func.func private @backward_segment_1(%gs: !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    %r = fusion.rotate_half %gs
// CHECK-LABEL: func.func @backward(
// CHECK:         hir.launch_kernel @backward_segment_0 {{.*}} outs(%gs
// CHECK:         hir.launch_kernel @backward_segment_1 ins(%gs
func.func @backward(%g: !x, %c: !x, %s: !x) -> !x {
  %gs = fusion.mul %g, %s : (!x, !x) -> !x
  %r = fusion.rotate_half %gs : !x -> !x
  %n = fusion.neg %r : !x -> !x
  %gc = fusion.mul %g, %c : (!x, !x) -> !x
  %o = fusion.add %gc, %n : (!x, !x) -> !x
  func.return %o : !x
}
