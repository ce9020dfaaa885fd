// RUN: hir-opt %s -p hir-lowering | filecheck %s

// nvFuser's tensor-parallel MLP with sequence parallelism on a mesh of 2, every tensor
// of the chain stream-parallel: allgather -> matmul -> bias + tanh-GELU -> matmul ->
// reduce-scatter. It lowers into one stream loop: chunk i is gathered, goes through
// both GEMMs and is reduce-scattered on stream i mod number_of_streams, so the
// intermediates between the collectives take one slice per stream (per-stream-buffers),
// not one per chunk. The weights' broadcasts (w2's written between the two matmuls)
// read and write no buffer of the loops: they run once, before the loops, and do not
// split the pipeline.

!x = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _]>
!w = !fusion.tensor<[2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>
!b = !fusion.tensor<[2, ?], bf16, mesh = [0, 1], axes = [didx, _]>
!gathered = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, _, _, _]>
!rows = !fusion.tensor<[?, 1, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, _, _, _, _]>
!wb = !fusion.tensor<[1, 2, 1, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _, _]>
!bb = !fusion.tensor<[1, 2, 1, 1, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _, _]>
!h = !fusion.tensor<[?, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _, _]>
!c = !fusion.tensor<[], bf16, mesh = [0, 1]>
!out = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _]>

func.func @tp_mlp(%x: !x, %w1: !w, %b1: !b, %w2: !w) -> !out {
  %gathered = fusion.set %x : !x -> !gathered
  %rows = fusion.broadcast %gathered [1] : !gathered -> !rows
  %w1b = fusion.broadcast %w1 [0, 2] : !w -> !wb
  %mm1 = fusion.matmul %rows, %w1b : (!rows, !wb) -> !h
  %b1b = fusion.broadcast %b1 [0, 2, 3] : !b -> !bb
  %h = fusion.add %mm1, %b1b : (!h, !bb) -> !h
  %h2 = fusion.mul %h, %h : (!h, !h) -> !h
  %h3 = fusion.mul %h2, %h : (!h, !h) -> !h
  %kappa = fusion.constant 0.044715 : bf16 : !c
  %h3k = fusion.mul %h3, %kappa : (!h, !c) -> !h
  %sum = fusion.add %h, %h3k : (!h, !h) -> !h
  %scale = fusion.constant 0.7978845608028654 : bf16 : !c
  %inner = fusion.mul %sum, %scale : (!h, !c) -> !h
  %tanh = fusion.tanh %inner : !h -> !h
  %one = fusion.constant 1.0 : bf16 : !c
  %onep = fusion.add %tanh, %one : (!h, !c) -> !h
  %half = fusion.constant 0.5 : bf16 : !c
  %hh = fusion.mul %h, %half : (!h, !c) -> !h
  %gelu = fusion.mul %hh, %onep : (!h, !h) -> !h
  %w2b = fusion.broadcast %w2 [0, 2] : !w -> !wb
  %partial = fusion.matmul %gelu, %w2b : (!h, !wb) -> !h
  %out = fusion.sum %partial [1] : !h -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @tp_mlp(
// CHECK:         %[[SLOTS:[^ ]+]] = arith.minui %[[EXTENT:[^,]+]], %num_streams
// CHECK:         %w1b = hir.allocate
// CHECK-NEXT:    hir.post_on_stream @tp_mlp_segment_{{[0-9]+}} ins(%w1 : {{.*}}) outs(%w1b :
// CHECK-NEXT:    %mm1 = hir.allocate(%[[SLOTS]], {{.*}}) : !fusion.tensor<[?, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _, _]>
// CHECK:         %gelu = hir.allocate(%[[SLOTS]], {{.*}}) : !fusion.tensor<[?, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _, _]>
// CHECK-NEXT:    %w2b = hir.allocate
// CHECK-NEXT:    hir.post_on_stream @tp_mlp_segment_{{[0-9]+}} ins(%w2 : {{.*}}) outs(%w2b :
// CHECK-NEXT:    %partial = hir.allocate(%[[SLOTS]], {{.*}}) : !fusion.tensor<[?, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _, _]>
// CHECK-NEXT:    %out = hir.allocate(%[[EXTENT]], {{.*}}) : !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _]>
// CHECK-NEXT:    scf.for
// CHECK:           hir.synchronize_stream %main_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] =
// CHECK-NEXT:      %[[SLOT:[^ ]+]] = arith.remui %[[I]], %num_streams
// CHECK:           hir.allgather
// CHECK-NEXT:      hir.wait
// CHECK:           hir.post_on_stream @tp_mlp_segment_{{[0-9]+}}_slice
// CHECK:           %[[MM1_I:[^ ]+]] = hir.alias_select %mm1[0 = %[[SLOT]]]
// CHECK-NEXT:      hir.matmul ins({{.*}}) outs(%[[MM1_I]] :
// CHECK-NEXT:      %[[GELU_I:[^ ]+]] = hir.alias_select %gelu[0 = %[[SLOT]]]
// CHECK-NEXT:      hir.launch_kernel @tp_mlp_segment_{{[0-9]+}}_slice ins(%b1, %[[MM1_I]] : {{.*}}) outs(%[[GELU_I]] :
// CHECK-NEXT:      %[[W2B_0:[^ ]+]] = hir.alias_select %w2b[0 = %c0]
// CHECK-NEXT:      %[[PARTIAL_I:[^ ]+]] = hir.alias_select %partial[0 = %[[SLOT]]]
// CHECK-NEXT:      hir.matmul ins(%[[GELU_I]], %[[W2B_0]] : {{.*}}) outs(%[[PARTIAL_I]] :
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %out[0 = %[[I]]]
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.reduce_scatter %[[PARTIAL_I]] into %[[OUT_I]] team [0, 1] op sum backend nccl
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream %main_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NOT:     scf.for
// CHECK:         func.return %out
