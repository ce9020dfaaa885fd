// RUN: hir-opt %s -p fusion-to-hir | filecheck %s
// RUN: hir-opt %s -p fusion-to-hir > %t && hir-opt %t -p fusion-to-hir | diff %t -

// A run holds reductions over the last axis of its iteration space, kept (keepdim): a
// kernel then walks the space row by row, reduces each row, and computes the pointwise
// ops after the reduction from the reduced value broadcast along the row. Its outputs
// are written per element, or once per row (RMSNorm's scale, which the backward reads).

!x = !fusion.tensor<[?, 64], f32>
!row = !fusion.tensor<[?, 1], f32>
!w = !fusion.tensor<[64], f32>
!s = !fusion.tensor<[], f32>

// RMSNorm as the importer writes torch's: x * rsqrt(mean(x^2) + eps) * w, the mean a sum
// divided by the row's length. One segment, which returns the scale per row.

func.func @rms_norm(%x: !x, %w: !w) -> (!x, !row) {
  %two = fusion.constant 2.000000e+00 : f32 : !s
  %square = fusion.pow %x, %two : (!x, !s) -> !x
  %sum = fusion.sum %square [1] keepdim : !x -> !row
  %n = fusion.constant 6.400000e+01 : f32 : !s
  %mean = fusion.div %sum, %n : (!row, !s) -> !row
  %eps = fusion.constant 9.99999974E-6 : f32 : !s
  %shifted = fusion.add %mean, %eps : (!row, !s) -> !row
  %scale = fusion.rsqrt %shifted : !row -> !row
  %normed = fusion.mul %x, %scale : (!x, !row) -> !x
  %y = fusion.mul %normed, %w : (!x, !w) -> !x
  func.return %y, %scale : !x, !row
}

// CHECK-LABEL: func.func private @rms_norm_segment_0(
// CHECK-SAME:      %x: !fusion.tensor<[?, 64], f32>, %w: !fusion.tensor<[64], f32>)
// CHECK-SAME:      -> (!fusion.tensor<[?, 1], f32>, !fusion.tensor<[?, 64], f32>) {
// CHECK-NEXT:    %two = fusion.constant 2.000000e+00 : f32
// CHECK-NEXT:    %square = fusion.pow %x, %two
// CHECK-NEXT:    %sum = fusion.sum %square [1] keepdim
// CHECK-NEXT:    %n = fusion.constant 6.400000e+01 : f32
// CHECK-NEXT:    %mean = fusion.div %sum, %n
// CHECK-NEXT:    %eps = fusion.constant
// CHECK-NEXT:    %shifted = fusion.add %mean, %eps
// CHECK-NEXT:    %scale = fusion.rsqrt %shifted
// CHECK-NEXT:    %normed = fusion.mul %x, %scale
// CHECK-NEXT:    %y = fusion.mul %normed, %w
// CHECK-NEXT:    func.return %scale, %y
// CHECK-NEXT:  }
// CHECK-LABEL: func.func @rms_norm(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[SCALE:[^ ]+]] = hir.allocate(%[[N]]) : !fusion.tensor<[?, 1], f32>
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[N]]) : !fusion.tensor<[?, 64], f32>
// CHECK-NEXT:    hir.launch_kernel @rms_norm_segment_0 ins(%x, %w : {{.*}}) outs(%[[SCALE]], %[[Y]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]], %[[SCALE]]

// A value of lower rank that broadcasts along the run's rows is no output of the run (a
// kernel would write it again at every row): the cast of the next norm's weight, which
// aot_autograd may put among the first norm's ops, ends the run, and joins the run that
// reads it after the GEMM.

!mm = !fusion.tensor<[64, 64], f32>

func.func @weight_cast_between_norms(%x: !x, %w: !w, %v: !fusion.tensor<[64], bf16>, %m: !mm) -> !x {
  %two = fusion.constant 2.000000e+00 : f32 : !s
  %square = fusion.pow %x, %two : (!x, !s) -> !x
  %sum = fusion.sum %square [1] keepdim : !x -> !row
  %scale = fusion.rsqrt %sum : !row -> !row
  %normed = fusion.mul %x, %scale : (!x, !row) -> !x
  %y = fusion.mul %normed, %w : (!x, !w) -> !x
  %v32 = fusion.cast %v : !fusion.tensor<[64], bf16> -> !w
  %p = fusion.matmul %y, %m : (!x, !mm) -> !x
  %z = fusion.mul %p, %v32 : (!x, !w) -> !x
  func.return %z : !x
}

// CHECK-LABEL: func.func private @weight_cast_between_norms_segment_0(
// CHECK-SAME:      -> !fusion.tensor<[?, 64], f32> {
// CHECK-NOT:     fusion.cast
// CHECK:         func.return %y
// CHECK-NEXT:  }
// CHECK-LABEL: func.func private @weight_cast_between_norms_segment_1(
// CHECK-SAME:      %v: !fusion.tensor<[64], bf16>, %p: !fusion.tensor<[?, 64], f32>)
// CHECK-NEXT:    %v32 = fusion.cast %v
// CHECK-NEXT:    %z = fusion.mul %p, %v32
// CHECK-NEXT:    func.return %z
// CHECK-LABEL: func.func @weight_cast_between_norms(
// CHECK:         hir.launch_kernel @weight_cast_between_norms_segment_0 ins(%x, %w : {{.*}})
// CHECK:         hir.matmul
// CHECK:         hir.launch_kernel @weight_cast_between_norms_segment_1 ins(%v, %{{.*}} : {{.*}})

// RMSNorm's backward as torch's decomposition writes it: the row sum of the gradient
// times x, expanded along the row. The weight's gradient sums over the rows (a column
// sum): the run passes over it, then the segment takes it in place of the product that
// only the sum reads, and returns the sum (its kernel sums the columns as it walks the
// rows; the product is never written).

!gx = !fusion.tensor<[32, 64], f32>
!grow = !fusion.tensor<[32, 1], f32>

func.func @rms_norm_backward(%g: !gx, %x: !gx, %w: !w, %scale: !grow, %normed: !gx) -> (!gx, !fusion.tensor<[1, 64], f32>) {
  %gw = fusion.mul %g, %normed : (!gx, !gx) -> !gx
  %dx_hat = fusion.mul %g, %w : (!gx, !w) -> !gx
  %dw = fusion.sum %gw [0] keepdim : !gx -> !fusion.tensor<[1, 64], f32>
  %dot = fusion.mul %dx_hat, %x : (!gx, !gx) -> !gx
  %direct = fusion.mul %dx_hat, %scale : (!gx, !grow) -> !gx
  %sum = fusion.sum %dot [1] keepdim : !gx -> !grow
  %three = fusion.constant 3.000000e+00 : f32 : !s
  %cube = fusion.pow %scale, %three : (!grow, !s) -> !grow
  %half = fusion.constant -5.000000e-01 : f32 : !s
  %a = fusion.mul %sum, %half : (!grow, !s) -> !grow
  %b = fusion.mul %a, %cube : (!grow, !grow) -> !grow
  %spread = fusion.expand %b : !grow -> !gx
  %n = fusion.constant 6.400000e+01 : f32 : !s
  %c = fusion.div %spread, %n : (!gx, !s) -> !gx
  %two = fusion.constant 2.000000e+00 : f32 : !s
  %d = fusion.mul %x, %two : (!gx, !s) -> !gx
  %e = fusion.mul %c, %d : (!gx, !gx) -> !gx
  %dx = fusion.add %direct, %e : (!gx, !gx) -> !gx
  func.return %dx, %dw : !gx, !fusion.tensor<[1, 64], f32>
}

// CHECK-LABEL: func.func private @rms_norm_backward_segment_0(
// CHECK-SAME:      -> (!fusion.tensor<[1, 64], f32>, !fusion.tensor<[32, 64], f32>) {
// CHECK-NEXT:    %gw = fusion.mul %g, %normed
// CHECK-NEXT:    %dx_hat = fusion.mul %g, %w
// CHECK-NEXT:    %dot = fusion.mul %dx_hat, %x
// CHECK-NEXT:    %direct = fusion.mul %dx_hat, %scale
// CHECK-NEXT:    %sum = fusion.sum %dot [1] keepdim
// CHECK:         %spread = fusion.expand %b
// CHECK:         %dx = fusion.add %direct, %e
// CHECK-NEXT:    %dw = fusion.sum %gw [0] keepdim : !fusion.tensor<[32, 64], f32> -> !fusion.tensor<[1, 64], f32>
// CHECK-NEXT:    func.return %dw, %dx
// CHECK-NEXT:  }
// CHECK-LABEL: func.func @rms_norm_backward(
// CHECK-NEXT:    %[[DW:[^ ]+]] = hir.allocate() : !fusion.tensor<[1, 64], f32>
// CHECK-NEXT:    %[[DX:[^ ]+]] = hir.allocate() : !fusion.tensor<[32, 64], f32>
// CHECK-NEXT:    hir.launch_kernel @rms_norm_backward_segment_0 ins(%g, %normed, %w, %x, %scale : {{.*}}) outs(%[[DW]], %[[DX]] : {{.*}})
// CHECK-NEXT:    func.return %[[DX]], %[[DW]]

// The same with the summed axis dropped, as torch's decomposition of the fused RMSNorm's
// backward (which GPUs call) sums the weight's gradient.

func.func @rms_norm_backward_fused(%g: !gx, %x: !gx, %scale: !grow) -> (!gx, !w) {
  %normed = fusion.mul %x, %scale : (!gx, !grow) -> !gx
  %gw = fusion.mul %g, %normed : (!gx, !gx) -> !gx
  %dot = fusion.mul %g, %normed : (!gx, !gx) -> !gx
  %sum = fusion.sum %dot [1] keepdim : !gx -> !grow
  %dx = fusion.mul %g, %sum : (!gx, !grow) -> !gx
  %dw = fusion.sum %gw [0] : !gx -> !w
  func.return %dx, %dw : !gx, !w
}

// CHECK-LABEL: func.func private @rms_norm_backward_fused_segment_0(
// CHECK-SAME:      -> (!fusion.tensor<[64], f32>, !fusion.tensor<[32, 64], f32>) {
// CHECK:         %dw = fusion.sum %gw [0] : !fusion.tensor<[32, 64], f32> -> !fusion.tensor<[64], f32>
// CHECK-NEXT:    func.return %dw, %dx
// CHECK-LABEL: func.func @rms_norm_backward_fused(
// CHECK-NOT:     hir.reduction
// CHECK:         func.return

// The column sum stays a reduction of its own where the segment must return the value
// anyway (read after it by another op), or reduces no rows (a kernel of the flat space),
// or where the value has a stream axis (a stream loop runs the segment slice by slice).

func.func @column_sums_left(%x: !gx, %scale: !grow, %m: !mm) -> (!gx, !fusion.tensor<[1, 64], f32>, !fusion.tensor<[1, 64], f32>) {
  %p = fusion.mul %x, %scale : (!gx, !grow) -> !gx
  %dot = fusion.sum %p [1] keepdim : !gx -> !grow
  %q = fusion.mul %p, %dot : (!gx, !grow) -> !gx
  %dp = fusion.sum %p [0] keepdim : !gx -> !fusion.tensor<[1, 64], f32>
  %t = fusion.matmul %q, %m : (!gx, !mm) -> !gx
  %e = fusion.exp %t : !gx -> !gx
  %de = fusion.sum %e [0] keepdim : !gx -> !fusion.tensor<[1, 64], f32>
  func.return %p, %dp, %de : !gx, !fusion.tensor<[1, 64], f32>, !fusion.tensor<[1, 64], f32>
}

// CHECK-LABEL: func.func @column_sums_left(
// CHECK:         hir.launch_kernel @column_sums_left_segment_0 ins(%x, %scale : {{.*}}) outs(%[[P:[^ ,]+]], %{{[^ ]+}} : {{.*}})
// CHECK:         hir.reduction "sum" [0] keepdim ins(%[[P]] : {{.*}})
// CHECK:         hir.launch_kernel @column_sums_left_segment_1 ins(%{{.*}}) outs(%[[E:[^ ]+]] : {{.*}})
// CHECK:         hir.reduction "sum" [0] keepdim ins(%[[E]] : {{.*}})

!srows = !fusion.tensor<[4, 64], f32, mesh = [0, 1], axes = [stream, _]>
!srow = !fusion.tensor<[4, 1], f32, mesh = [0, 1], axes = [stream, _]>
!scols = !fusion.tensor<[1, 64], f32, mesh = [0, 1]>

func.func @column_sum_of_stream_rows(%x: !srows) -> (!srows, !scols) {
  %dot = fusion.sum %x [1] keepdim : !srows -> !srow
  %p = fusion.mul %x, %dot : (!srows, !srow) -> !srows
  %q = fusion.exp %p : !srows -> !srows
  %dp = fusion.sum %q [0] keepdim : !srows -> !scols
  func.return %p, %dp : !srows, !scols
}

// CHECK-LABEL: func.func @column_sum_of_stream_rows(
// CHECK:         hir.launch_kernel @column_sum_of_stream_rows_segment_0
// CHECK:         hir.reduction "sum" [0] keepdim

// Softmax: a row's max, then the sum of the exponentials of the row less its max, two
// reductions of one kernel; the second reads the first.

func.func @softmax(%x: !x) -> !x {
  %max = fusion.max %x [1] keepdim : !x -> !row
  %shifted = fusion.sub %x, %max : (!x, !row) -> !x
  %e = fusion.exp %shifted : !x -> !x
  %sum = fusion.sum %e [1] keepdim : !x -> !row
  %y = fusion.div %e, %sum : (!x, !row) -> !x
  func.return %y : !x
}

// CHECK-LABEL: func.func private @softmax_segment_0(
// CHECK-SAME:      %x: !fusion.tensor<[?, 64], f32>) -> !fusion.tensor<[?, 64], f32> {
// CHECK-NEXT:    %max = fusion.max %x [1] keepdim
// CHECK-NEXT:    %shifted = fusion.sub %x, %max
// CHECK-NEXT:    %e = fusion.exp %shifted
// CHECK-NEXT:    %sum = fusion.sum %e [1] keepdim
// CHECK-NEXT:    %y = fusion.div %e, %sum
// CHECK-NEXT:    func.return %y
// CHECK-LABEL: func.func @softmax(
// CHECK-NOT:     hir.reduction
// CHECK:         hir.launch_kernel @softmax_segment_0

// A reduction that is not of the rows stays an hir.reduction: over another axis, without
// keepdim, or over the last axis of a value the run walks at a lower rank.

!b = !fusion.tensor<[4, ?, 64], f32>

func.func @not_rows(%x: !x, %y: !b) -> (!fusion.tensor<[?], f32>, !b) {
  %e = fusion.exp %x : !x -> !x
  %flat = fusion.sum %e [1] : !x -> !fusion.tensor<[?], f32>
  %sum = fusion.sum %e [1] keepdim : !x -> !row
  %z = fusion.mul %y, %sum : (!b, !row) -> !b
  func.return %flat, %z : !fusion.tensor<[?], f32>, !b
}

// CHECK-LABEL: func.func private @not_rows_segment_0(
// CHECK-NEXT:    %e = fusion.exp %x
// CHECK-NEXT:    func.return %e
// CHECK-LABEL: func.func private @not_rows_segment_1(
// CHECK-NEXT:    %z = fusion.mul %y, %sum
// CHECK-NEXT:    func.return %z
// CHECK-LABEL: func.func @not_rows(
// CHECK:         hir.launch_kernel @not_rows_segment_0
// CHECK:         hir.reduction "sum" [1] ins
// CHECK:         hir.reduction "sum" [1] keepdim
// CHECK:         hir.launch_kernel @not_rows_segment_1

// A varying gradient read with an axis put back after its device axis (`fusion.broadcast`,
// RMSNorm's backward with one sequence): a kernel walks each device's piece, whose device
// axis has extent 1, so the cast before the broadcast and the row kernel after it are one
// run, and one segment. Aligned by their whole shapes, the device axis of the cast's
// result would meet the broadcast's axis 1 (extent 2 against 1) and cut the run.

!vg = !fusion.tensor<[2, 16, 64], bf16, mesh = [0, 1], axes = [didx, _, _]>
!vgf = !fusion.tensor<[2, 16, 64], f32, mesh = [0, 1], axes = [didx, _, _]>
!vx = !fusion.tensor<[2, 1, 16, 64], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!vrow = !fusion.tensor<[2, 1, 16, 1], f32, mesh = [0, 1], axes = [didx, _, _, _]>

// CHECK-LABEL: func.func @gradient_with_its_batch_axis_back(
// CHECK-NOT:     hir.post_on_stream
// CHECK:         hir.launch_kernel @gradient_with_its_batch_axis_back_segment_0 ins(%g, %x : {{.*}}) outs(%{{[^ ]+}} : {{.*}})
// CHECK-NOT:     hir.launch_kernel
// CHECK:         func.return
func.func @gradient_with_its_batch_axis_back(%g: !vg, %x: !vx) -> !vx {
  %wide = fusion.cast %g : !vg -> !vgf
  %back = fusion.broadcast %wide [1] : !vgf -> !vx
  %product = fusion.mul %back, %x : (!vx, !vx) -> !vx
  %sum = fusion.sum %product [3] keepdim : !vx -> !vrow
  %out = fusion.mul %x, %sum : (!vx, !vrow) -> !vx
  func.return %out : !vx
}
