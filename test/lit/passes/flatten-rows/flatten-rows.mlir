// RUN: hir-opt %s -p flatten-rows | filecheck %s
// RUN: hir-opt %s -p flatten-rows > %t && hir-opt %t -p flatten-rows | diff %t -
// RUN: hir-opt %s -p flatten-rows,fusion-to-hir | filecheck %s --check-prefix=KERNELS

// flatten-rows: pointwise work on [batch, sequence, width] values and on their rows
// [tokens, width] (a linear layer's product, as aot_autograd saves it) is computed on the
// rows, so that a kernel's iteration space holds all of it.

!rows = !fusion.tensor<[4, 8], f32>
!seqs = !fusion.tensor<[2, 2, 8], f32>

// SwiGLU's backward: the activation recomputed from the saved products (rows), the incoming
// gradient per sequence. All of it on rows: one reshape of the gradient in, one of each
// result out, none in between; the reshapes of the saved products are gone.
// CHECK-LABEL: func.func @swiglu_backward(
// CHECK-NEXT:    %0 = fusion.aten "aten.reshape.default"(%g, [4, 8]) : (!fusion.tensor<[2, 2, 8], f32>) -> !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    %s = fusion.sigmoid %gate : !fusion.tensor<[4, 8], f32> -> !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    %silu = fusion.mul %gate, %s : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    %d_up = fusion.mul %0, %silu : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    %d_up_1 = fusion.aten "aten.reshape.default"(%d_up, [2, 2, 8]) : (!fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[2, 2, 8], f32>
// CHECK-NEXT:    %d_silu = fusion.mul %0, %up : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    %d_gate = fusion.mul %d_silu, %s : (!fusion.tensor<[4, 8], f32>, !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[4, 8], f32>
// CHECK-NEXT:    %d_gate_1 = fusion.aten "aten.reshape.default"(%d_gate, [2, 2, 8]) : (!fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[2, 2, 8], f32>
// CHECK-NEXT:    func.return %d_up_1, %d_gate_1 : !fusion.tensor<[2, 2, 8], f32>, !fusion.tensor<[2, 2, 8], f32>
// KERNELS-LABEL: func.func @swiglu_backward(
// KERNELS-COUNT-1: hir.launch_kernel
// KERNELS-NOT:     hir.launch_kernel
// KERNELS:         func.return
func.func @swiglu_backward(%gate: !rows, %up: !rows, %g: !seqs) -> (!seqs, !seqs) {
  %s = fusion.sigmoid %gate : !rows -> !rows
  %silu = fusion.mul %gate, %s : (!rows, !rows) -> !rows
  %silu_seqs = fusion.aten "aten.reshape.default"(%silu, [2, 2, 8]) : (!rows) -> !seqs
  %d_up = fusion.mul %g, %silu_seqs : (!seqs, !seqs) -> !seqs
  %up_seqs = fusion.aten "aten.view.default"(%up, [2, 2, 8]) : (!rows) -> !seqs
  %d_silu = fusion.mul %g, %up_seqs : (!seqs, !seqs) -> !seqs
  %s_seqs = fusion.aten "aten.reshape.default"(%s, [2, 2, 8]) : (!rows) -> !seqs
  %d_gate = fusion.mul %d_silu, %s_seqs : (!seqs, !seqs) -> !seqs
  func.return %d_up, %d_gate : !seqs, !seqs
}

// RMSNorm on varying values (each device's piece [2, 2, 8], its device axis first): the
// reduction over the last axis, kept, its row values [rows, 1], the weight [8] as it is,
// and the weight's gradient (a sum over every axis of the piece but the last) on rows.
!v = !fusion.tensor<[2, 2, 2, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!vrow = !fusion.tensor<[2, 2, 2, 1], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!vrows = !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>
!w = !fusion.tensor<[8], f32, mesh = [0, 1]>
!vw = !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]>
// CHECK-LABEL: func.func @rms_norm(
// CHECK-NEXT:    %0 = fusion.aten "aten.reshape.default"(%g, [4, 8]) : (!fusion.tensor<[2, 2, 2, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>) -> !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    %square = fusion.mul %x, %x : ({{.*}}[2, 4, 8]{{.*}}) -> !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    %ms = fusion.sum %square [2] keepdim : {{.*}} -> !fusion.tensor<[2, 4, 1], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    %r = fusion.rsqrt %ms
// CHECK-NEXT:    %n = fusion.mul %x, %r : ({{.*}}[2, 4, 8]{{.*}}, {{.*}}[2, 4, 1]{{.*}})
// CHECK-NEXT:    %y = fusion.mul %n, %w : ({{.*}}[2, 4, 8]{{.*}}, !fusion.tensor<[8], f32, mesh = [0, 1]>)
// CHECK-NEXT:    %y_1 = fusion.aten "aten.reshape.default"(%y, [2, 2, 8]) : ({{.*}}[2, 4, 8]{{.*}}) -> !fusion.tensor<[2, 2, 2, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
// CHECK-NEXT:    %gn = fusion.mul %0, %n
// CHECK-NEXT:    %dw = fusion.sum %gn [1] : {{.*}} -> !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]>
// CHECK-NEXT:    func.return %y_1, %dw
func.func @rms_norm(%x: !vrows, %w: !w, %g: !v) -> (!v, !vw) {
  %x_seqs = fusion.aten "aten.reshape.default"(%x, [2, 2, 8]) : (!vrows) -> !v
  %square = fusion.mul %x_seqs, %x_seqs : (!v, !v) -> !v
  %ms = fusion.sum %square [3] keepdim : !v -> !vrow
  %r = fusion.rsqrt %ms : !vrow -> !vrow
  %n = fusion.mul %x_seqs, %r : (!v, !vrow) -> !v
  %y = fusion.mul %n, %w : (!v, !w) -> !v
  %gn = fusion.mul %g, %n : (!v, !v) -> !v
  %dw = fusion.sum %gn [1, 2] : !v -> !vw
  func.return %y, %dw : !v, !vw
}

// Left as they are: a cluster with a value broadcast over one leading axis but not the
// other (a rotary embedding's table), one with a broadcast (it puts axes of its own), an
// add of a GEMM's product (sum-in-matmul makes it in the GEMM), and one on values of one
// form alone.
// CHECK-LABEL: func.func @left(
// CHECK-NEXT:    %x_seqs = fusion.aten "aten.reshape.default"(%x, [2, 2, 8])
// CHECK-NEXT:    %rotated = fusion.mul %x_seqs, %table : (!fusion.tensor<[2, 2, 8], f32>, !fusion.tensor<[1, 2, 8], f32>) -> !fusion.tensor<[2, 2, 8], f32>
// CHECK-NEXT:    %y_seqs = fusion.aten "aten.reshape.default"(%x, [2, 2, 8])
// CHECK-NEXT:    %b = fusion.broadcast %v [0, 1]
// CHECK-NEXT:    %scaled = fusion.mul %y_seqs, %b
// CHECK-NEXT:    %p = fusion.matmul %g, %wt
// CHECK-NEXT:    %sum = fusion.add %p, %x_seqs
// CHECK-NEXT:    %same = fusion.neg %g : !fusion.tensor<[2, 2, 8], f32> -> !fusion.tensor<[2, 2, 8], f32>
// CHECK-NEXT:    func.return
func.func @left(%x: !rows, %table: !fusion.tensor<[1, 2, 8], f32>, %v: !fusion.tensor<[8], f32>, %g: !seqs, %wt: !fusion.tensor<[8, 8], f32>) -> (!seqs, !seqs, !seqs, !seqs) {
  %x_seqs = fusion.aten "aten.reshape.default"(%x, [2, 2, 8]) : (!rows) -> !seqs
  %rotated = fusion.mul %x_seqs, %table : (!seqs, !fusion.tensor<[1, 2, 8], f32>) -> !seqs
  %y_seqs = fusion.aten "aten.reshape.default"(%x, [2, 2, 8]) : (!rows) -> !seqs
  %b = fusion.broadcast %v [0, 1] : !fusion.tensor<[8], f32> -> !fusion.tensor<[1, 1, 8], f32>
  %scaled = fusion.mul %y_seqs, %b : (!seqs, !fusion.tensor<[1, 1, 8], f32>) -> !seqs
  %p = fusion.matmul %g, %wt : (!seqs, !fusion.tensor<[8, 8], f32>) -> !seqs
  %sum = fusion.add %p, %x_seqs : (!seqs, !seqs) -> !seqs
  %same = fusion.neg %g : !seqs -> !seqs
  func.return %rotated, %scaled, %sum, %same : !seqs, !seqs, !seqs, !seqs
}
