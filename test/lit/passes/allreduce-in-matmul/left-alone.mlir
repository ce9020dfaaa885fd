// RUN: hir-opt %s -p allreduce-in-matmul | filecheck %s
// RUN: hir-opt %s -p 'allreduce-in-matmul{explain=true}' 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// Left alone, each copy-engine allreduce saying why with `explain=true`: a team of four
// (it keeps its allreduce in two phases), a reduction that is not a sum, a product that
// no matmul makes, a product with a bias (the GEMMs of both devices would add it), an
// allreduce outside a stream loop, and a loop that does more than its GEMM+AR. NCCL's
// allreduce is not the pass's: no remark.

!a4 = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!b4 = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!chunk_a4 = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!partial4 = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _]>
!out4 = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>
!chunk_out4 = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>
!a = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [_, didx, _, _]>
!b = !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
!chunk_a = !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
!partial = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, didx, _, _]>
!out = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _]>
!chunk_out = !fusion.tensor<[?, ?], f32, mesh = [0, 1]>
!bias = !fusion.tensor<[2, 1, ?], f32, mesh = [0, 1], axes = [didx, _, _]>

func.func @left_alone(%a4: !a4, %b4: !b4, %out4: !out4, %a: !a, %b: !b, %out: !out, %copied: !out, %bias: !bias) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %main_stream = hir.get_current_stream
  %num_streams = hir.number_of_streams
  %s = hir.dim %a, 0 : !a
  %m = hir.dim %a, 2 : !a
  %n = hir.dim %b, 2 : !b
  %p4 = hir.allocate(%s, %m, %n) symmetric : !partial4
  scf.for %i = %c0 to %s step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    %a_slice = hir.alias_select %a4[0 = %i] : !a4 -> !chunk_a4
    %p_slice = hir.alias_select %p4[0 = %i] : !partial4 -> !chunk_a4
    hir.matmul ins(%a_slice, %b4 : !chunk_a4, !b4) outs(%p_slice : !chunk_a4)
    %out_slice = hir.alias_select %out4[0 = %i] : !out4 -> !chunk_out4
    // REMARK: left-alone.mlir:{{[0-9]+:[0-9]+}}: remark: allreduce-in-matmul leaves this hir.allreduce: its team has 4 members; the schedule is one of a pair
    %w = hir.allreduce %p_slice into %out_slice team [0, 1, 2, 3] op sum backend cuda : !chunk_a4, !chunk_out4
    hir.wait %w
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream
  }
  %p_max = hir.allocate(%s, %m, %n) symmetric : !partial
  %p_max_0 = hir.alias_select %p_max[0 = %c0] : !partial -> !chunk_a
  %a_0 = hir.alias_select %a[0 = %c0] : !a -> !chunk_a
  %out_0 = hir.alias_select %out[0 = %c0] : !out -> !chunk_out
  hir.matmul ins(%a_0, %b : !chunk_a, !b) outs(%p_max_0 : !chunk_a)
  // REMARK: left-alone.mlir:{{[0-9]+:[0-9]+}}: remark: allreduce-in-matmul leaves this hir.allreduce: its reduction is not a sum
  %w_max = hir.allreduce %p_max_0 into %out_0 team [0, 1] op max backend cuda : !chunk_a, !chunk_out
  hir.wait %w_max
  %p_copy = hir.allocate(%s, %m, %n) symmetric : !partial
  %p_copy_0 = hir.alias_select %p_copy[0 = %c0] : !partial -> !chunk_a
  hir.copy ins(%a_0 : !chunk_a) outs(%p_copy_0 : !chunk_a)
  // REMARK: left-alone.mlir:{{[0-9]+:[0-9]+}}: remark: allreduce-in-matmul leaves this hir.allreduce: its input is not the whole product of one plain matmul
  %w_copy = hir.allreduce %p_copy_0 into %out_0 team [0, 1] op sum backend cuda : !chunk_a, !chunk_out
  hir.wait %w_copy
  %p_bias = hir.allocate(%s, %m, %n) symmetric : !partial
  scf.for %i = %c0 to %s step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    %a_slice = hir.alias_select %a[0 = %i] : !a -> !chunk_a
    %p_slice = hir.alias_select %p_bias[0 = %i] : !partial -> !chunk_a
    hir.matmul ins(%a_slice, %b, %bias : !chunk_a, !b, !bias) outs(%p_slice : !chunk_a)
    %out_slice = hir.alias_select %out[0 = %i] : !out -> !chunk_out
    // REMARK: left-alone.mlir:{{[0-9]+:[0-9]+}}: remark: allreduce-in-matmul leaves this hir.allreduce: its input is not the whole product of one plain matmul
    %w = hir.allreduce %p_slice into %out_slice team [0, 1] op sum backend cuda : !chunk_a, !chunk_out
    hir.wait %w
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream
  }
  %p_body = hir.allocate(%s, %m, %n) symmetric : !partial
  %p_body_0 = hir.alias_select %p_body[0 = %c0] : !partial -> !chunk_a
  hir.matmul ins(%a_0, %b : !chunk_a, !b) outs(%p_body_0 : !chunk_a)
  // REMARK: left-alone.mlir:{{[0-9]+:[0-9]+}}: remark: allreduce-in-matmul leaves this hir.allreduce: it is not in the body of a stream loop
  %w_body = hir.allreduce %p_body_0 into %out_0 team [0, 1] op sum backend cuda : !chunk_a, !chunk_out
  hir.wait %w_body
  %p_nccl = hir.allocate(%s, %m, %n) : !partial
  %p_nccl_0 = hir.alias_select %p_nccl[0 = %c0] : !partial -> !chunk_a
  hir.matmul ins(%a_0, %b : !chunk_a, !b) outs(%p_nccl_0 : !chunk_a)
  %w_nccl = hir.allreduce %p_nccl_0 into %out_0 team [0, 1] op sum backend nccl : !chunk_a, !chunk_out
  hir.wait %w_nccl
  %p_more = hir.allocate(%s, %m, %n) symmetric : !partial
  scf.for %i = %c0 to %s step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    %a_slice = hir.alias_select %a[0 = %i] : !a -> !chunk_a
    %p_slice = hir.alias_select %p_more[0 = %i] : !partial -> !chunk_a
    hir.matmul ins(%a_slice, %b : !chunk_a, !b) outs(%p_slice : !chunk_a)
    %out_slice = hir.alias_select %out[0 = %i] : !out -> !chunk_out
    // REMARK: left-alone.mlir:{{[0-9]+:[0-9]+}}: remark: allreduce-in-matmul leaves this hir.allreduce: its loop does more than this matmul and allreduce
    %w = hir.allreduce %p_slice into %out_slice team [0, 1] op sum backend cuda : !chunk_a, !chunk_out
    hir.wait %w
    %copied_slice = hir.alias_select %copied[0 = %i] : !out -> !chunk_out
    hir.copy ins(%out_slice : !chunk_out) outs(%copied_slice : !chunk_out)
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream
  }
  func.return
}

// REMARK-NOT: remark

// CHECK-LABEL: func.func @left_alone(
// CHECK-NOT:     accumulate
// CHECK-COUNT-7: hir.allreduce
// CHECK-NOT:     accumulate
