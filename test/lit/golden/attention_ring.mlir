// RUN: hir-opt %s -p auto-stream-parallel,hir-lowering | filecheck %s
// RUN: hir-opt %s -p 'auto-stream-parallel,hir-lowering{backend=cuda p2p_backend=cuda}' | filecheck %s --check-prefix=CUDA
// RUN: hir-opt %s -p auto-stream-parallel,hir-lowering > %t && hir-opt %t -p hir-lowering | diff %t -

// The ring of context parallelism on a mesh of 2, as torch.compile's graphs of the plain
// plan are imported (no stream axis written), in bf16.
//
// The forward: this device's queries against the keys and values all-gathered into blocks,
// the causal mask of a head-tail layout. auto-stream-parallel streams the blocks;
// stream-parallel's point-to-point ring brings them (one loop for both, slot
// s = (p + i) mod 2); attention-ring computes each block's attention on the caller's stream
// once the iteration's transfers are waited for: the first writes the result, each later
// one is merged into it by two fused segments, in f32. With 2 blocks the one merge reads
// the first block's output as the kernel gave it (bf16) and rounds the merged output into
// it once: no f32 buffer, nothing cast after the loop.
//
// The backward: the gradients of the keys and values (whole on every device, saved) go to
// their blocks' owners. attention-ring replaces the attention backward and the two
// reduce-scatters by a step per other device's block (a loop, of one step here, which
// canonicalize unrolls) that computes the block's shares and sends them to their owner on a
// pool stream, receiving from device (p - 1 - i) mod 2 its shares of this device's block;
// then the own block's gradients, computed while the last shares travel, into the outputs,
// to which the shares received are added (in f32, rounded once). The shares travel in the
// gradients' type (bf16), as the attention kernel computes them. With the copy engines the
// shares are symmetric buffers, which the peers read.

!q = !fusion.tensor<[2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
!blocks = !fusion.tensor<[2, 1, 2, 8, 16], bf16, mesh = [0, 1]>
!lse = !fusion.tensor<[2, 1, 2, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!saved = !fusion.tensor<[2, 2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _, _]>

func.func @attention_ring(%q: !q, %k: !q, %v: !q) -> (!q, !lse) {
  %keys = fusion.set %k : !q -> !blocks
  %values = fusion.set %v : !q -> !blocks
  %out, %lse = fusion.attention %q, %keys, %values causal head_tail blocks : (!q, !blocks, !blocks) -> (!q, !lse)
  func.return %out, %lse : !q, !lse
}

func.func @attention_ring_backward(%dout: !q, %q: !q, %k: !saved, %v: !saved, %out: !q, %lse: !lse) -> (!q, !q, !q) {
  %dq, %dk, %dv = fusion.attention_backward %dout, %q, %k, %v, %out, %lse causal head_tail blocks : (!q, !q, !saved, !saved, !q, !lse) -> (!q, !saved, !saved)
  %dk_owned = fusion.sum %dk [0] : !saved -> !q
  %dv_owned = fusion.sum %dv [0] : !saved -> !q
  func.return %dq, %dk_owned, %dv_owned : !q, !q, !q
}

// The merge, one kernel each on GPUs: the output's, from both log-sum-exps, then theirs.
// CHECK-LABEL: func.func private @attention_ring_merge_output_0(
// CHECK-SAME:      %[[OUT:[^:]+]]: !fusion.tensor<[2, 1, 2, 8, 16], bf16, {{.*}}, %[[LSE:[^:]+]]: !fusion.tensor<[2, 1, 2, 8], f32, {{.*}}, %[[BOUT:[^:]+]]: !fusion.tensor<[2, 1, 2, 8, 16], bf16, {{.*}}, %[[BLSE:[^:]+]]: !fusion.tensor<[2, 1, 2, 8], f32,
// CHECK:         %[[A:[^ ]+]] = fusion.broadcast %[[LSE]] [4]
// CHECK-NEXT:    %[[B:[^ ]+]] = fusion.broadcast %[[BLSE]] [4]
// CHECK-NEXT:    %[[LOWEST:[^ ]+]] = fusion.constant -3.40282347e+38 : f32
// CHECK-NEXT:    %[[M0:[^ ]+]] = fusion.maximum %[[A]], %[[B]]
// CHECK-NEXT:    %[[M:[^ ]+]] = fusion.maximum %[[M0]], %[[LOWEST]]
// CHECK-NEXT:    %[[D1:[^ ]+]] = fusion.sub %[[A]], %[[M]]
// CHECK-NEXT:    %[[W1:[^ ]+]] = fusion.exp %[[D1]]
// CHECK-NEXT:    %[[D2:[^ ]+]] = fusion.sub %[[B]], %[[M]]
// CHECK-NEXT:    %[[W2:[^ ]+]] = fusion.exp %[[D2]]
// CHECK-NEXT:    %[[SUM:[^ ]+]] = fusion.add %[[W1]], %[[W2]]
// CHECK-NEXT:    %[[WIDE_OUT:[^ ]+]] = fusion.cast %[[OUT]]
// CHECK-NEXT:    %[[WIDE:[^ ]+]] = fusion.cast %[[BOUT]]
// CHECK-NEXT:    %[[TINY:[^ ]+]] = fusion.constant 1.17549435e-38 : f32
// CHECK-NEXT:    %[[DIV:[^ ]+]] = fusion.maximum %[[SUM]], %[[TINY]]
// CHECK-NEXT:    %[[X1:[^ ]+]] = fusion.mul %[[W1]], %[[WIDE_OUT]]
// CHECK-NEXT:    %[[X2:[^ ]+]] = fusion.mul %[[W2]], %[[WIDE]]
// CHECK-NEXT:    %[[X:[^ ]+]] = fusion.add %[[X1]], %[[X2]]
// CHECK-NEXT:    %[[MERGED:[^ ]+]] = fusion.div %[[X]], %[[DIV]]
// CHECK-NEXT:    %[[ROUNDED:[^ ]+]] = fusion.cast %[[MERGED]] {{.*}} -> !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CHECK-NEXT:    func.return %[[ROUNDED]]
// CHECK-LABEL: func.func private @attention_ring_merge_lse_0(
// CHECK:         fusion.log
// CHECK-NEXT:    %[[NEW:[^ ]+]] = fusion.add
// CHECK-NEXT:    func.return %[[NEW]]

// CHECK-LABEL: func.func @attention_ring(
// CHECK-SAME:      %[[Q:[^:]+]]: !fusion.tensor<[2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>, %[[K:[^:]+]]: {{.*}}, %[[V:[^:]+]]: !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// CHECK-DAG:     %[[C2:[^ ]+]] = arith.constant 2 : index
// CHECK:         %[[KEYS:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [stream, _, _, _, _]>
// CHECK:         %[[VALUES:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [stream, _, _, _, _]>
// CHECK-NEXT:    %[[RESULT:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
// CHECK-NEXT:    %[[RESULT_LSE:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
// CHECK-NEXT:    %[[BLOCK_OUT:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [didx, _, _, _, _]>
// CHECK-NEXT:    %[[BLOCK_LSE:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
// CHECK-NEXT:    scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK-NEXT:      arith.remui %[[I]]
// CHECK-NEXT:      %[[STREAM:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[STREAM]]
// CHECK-NEXT:      %[[AHEAD:[^ ]+]] = arith.addi %[[RANK]], %[[I]] : index
// CHECK-NEXT:      %[[SLOT:[^ ]+]] = arith.remui %[[AHEAD]], %[[C2]] : index
// CHECK-NEXT:      %[[K_S:[^ ]+]] = hir.alias_select %[[KEYS]][0 = %[[SLOT]]]
// CHECK-NEXT:      %[[FIRST:[^ ]+]] = arith.cmpi eq, %[[I]], %[[C0]] : index
// CHECK-NEXT:      scf.if %[[FIRST]] {
// CHECK:             hir.copy ins({{.*}}) outs(%[[K_S]] :
// CHECK-NEXT:      } else {
// CHECK:             hir.recv %[[K_S]] from %[[SLOT]] backend nccl
// CHECK-NEXT:        hir.send %[[K]] to {{.*}} backend nccl
// CHECK:           }
// CHECK-NEXT:      %[[V_S:[^ ]+]] = hir.alias_select %[[VALUES]][0 = %[[SLOT]]]
// CHECK-NEXT:      scf.if %[[FIRST]] {
// CHECK:             hir.recv %[[V_S]] from %[[SLOT]] backend nccl
// CHECK-NEXT:        hir.send %[[V]] to {{.*}} backend nccl
// CHECK:           }
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[STREAM]]
// CHECK-NEXT:      scf.if %[[FIRST]] {
// CHECK-NEXT:        hir.attention causal head_tail block %[[SLOT]] ins(%[[Q]], %[[K_S]], %[[V_S]] : {{.*}}) outs(%[[RESULT]], %[[RESULT_LSE]] :
// CHECK-NEXT:      } else {
// CHECK-NEXT:        hir.attention causal head_tail block %[[SLOT]] ins(%[[Q]], %[[K_S]], %[[V_S]] : {{.*}}) outs(%[[BLOCK_OUT]], %[[BLOCK_LSE]] :
// CHECK-NEXT:        hir.launch_kernel @attention_ring_merge_output_0 ins(%[[RESULT]], %[[RESULT_LSE]], %[[BLOCK_OUT]], %[[BLOCK_LSE]] : {{.*}}) outs(%[[RESULT]] :
// CHECK-NEXT:        hir.launch_kernel @attention_ring_merge_lse_0 ins(%[[RESULT_LSE]], %[[BLOCK_LSE]] : {{.*}}) outs(%[[RESULT_LSE]] :
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NOT:     hir.pointwise "cast"
// CHECK:         func.return %[[RESULT]], %[[RESULT_LSE]]

// The sum of a share and a gradient, in f32, rounded once: one kernel each, one segment for all
// three (at 2 devices, every share is added once, in bf16 as the kernel computed it).
// CUDA-LABEL: func.func private @attention_ring_backward_sum_0(
// CUDA-SAME:      %[[A:[^:]+]]: !fusion.tensor<[2, 1, 2, 8, 16], bf16, {{.*}}, %[[B:[^:]+]]: !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     %[[WA:[^ ]+]] = fusion.cast %[[A]]
// CUDA-NEXT:     %[[WB:[^ ]+]] = fusion.cast %[[B]]
// CUDA-NEXT:     %[[S:[^ ]+]] = fusion.add %[[WA]], %[[WB]]
// CUDA-NEXT:     %[[R:[^ ]+]] = fusion.cast %[[S]] {{.*}} -> !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     func.return %[[R]]
// CUDA-NOT:      func.func private @attention_ring_backward_sum_1(

// CUDA-LABEL: func.func @attention_ring_backward(
// CUDA-SAME:      %[[DOUT:[^:]+]]: {{.*}}, %[[Q:[^:]+]]: {{.*}}, %[[K:[^:]+]]: {{.*}}, %[[V:[^:]+]]: {{.*}}, %[[OUT:[^:]+]]: {{.*}}, %[[LSE:[^:]+]]: !fusion.tensor<[2, 1, 2, 8], f32,
// CUDA-DAG:      %[[RANK:[^ ]+]] = hir.device_index
// CUDA-DAG:      %[[C2:[^ ]+]] = arith.constant 2 : index
// CUDA-DAG:      %[[MAIN:[^ ]+]] = hir.get_current_stream
// CUDA-DAG:      %[[C0:[^ ]+]] = arith.constant 0 : index
// CUDA-DAG:      %[[C1:[^ ]+]] = arith.constant 1 : index
// CUDA:          %[[DQ:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     %[[DK:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     %[[DV:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     %[[DQ_SHARE:[^ ]+]] = hir.allocate() : !fusion.tensor<[2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     %[[K_SHARE:[^ ]+]] = hir.allocate() symmetric : !fusion.tensor<[1, 2, 1, 2, 8, 16], bf16, mesh = [0, 1], axes = [_, didx, _, _, _, _]>
// CUDA-NEXT:     %[[V_SHARE:[^ ]+]] = hir.allocate() symmetric : !fusion.tensor<[1, 2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     %[[K_ARRIVED:[^ ]+]] = hir.allocate() : !fusion.tensor<[1, 2, 1, 2, 8, 16], bf16,
// CUDA-NEXT:     %[[V_ARRIVED:[^ ]+]] = hir.allocate() : !fusion.tensor<[1, 2, 1, 2, 8, 16], bf16,
// The transfers' pool stream first waits for the caller's (a CUDA graph's capture needs it).
// CUDA-NEXT:     %[[NEXT:[^ ]+]] = arith.addi %[[RANK]], %[[C1]] : index
// CUDA-NEXT:     %[[STREAM:[^ ]+]] = hir.stream %[[C0]]
// CUDA-NEXT:     hir.set_current_stream %[[STREAM]]
// CUDA-NEXT:     hir.synchronize_stream %[[MAIN]]
// CUDA-NEXT:     hir.set_current_stream %[[MAIN]]
// The one other block's step (the loop of one step, unrolled): its shares, sent on the pool stream.
// CUDA-NEXT:     %[[BLOCK:[^ ]+]] = arith.remui %[[NEXT]], %[[C2]] : index
// CUDA-NEXT:     %[[FROM:[^ ]+]] = arith.remui %[[NEXT]], %[[C2]] : index
// CUDA-NEXT:     %[[K_B:[^ ]+]] = hir.alias_select %[[K]][1 = %[[BLOCK]]]
// CUDA-NEXT:     %[[V_B:[^ ]+]] = hir.alias_select %[[V]][1 = %[[BLOCK]]]
// CUDA-NEXT:     %[[K_S:[^ ]+]] = hir.alias_select %[[K_SHARE]][0 = %[[C0]]]
// CUDA-NEXT:     %[[V_S:[^ ]+]] = hir.alias_select %[[V_SHARE]][0 = %[[C0]]]
// CUDA-NEXT:     %[[K_A:[^ ]+]] = hir.alias_select %[[K_ARRIVED]][0 = %[[C0]]]
// CUDA-NEXT:     %[[V_A:[^ ]+]] = hir.alias_select %[[V_ARRIVED]][0 = %[[C0]]]
// CUDA-NEXT:     hir.synchronize_stream %[[STREAM]]
// CUDA-NEXT:     hir.attention_backward causal head_tail block %[[BLOCK]] ins(%[[DOUT]], %[[Q]], %[[K_B]], %[[V_B]], %[[OUT]], %[[LSE]] : {{.*}}) outs(%[[DQ_SHARE]], %[[K_S]], %[[V_S]] :
// CUDA-NEXT:     hir.set_current_stream %[[STREAM]]
// CUDA-NEXT:     hir.synchronize_stream %[[MAIN]]
// CUDA-NEXT:     hir.start_coalescing
// CUDA-NEXT:     hir.recv %[[K_A]] from %[[FROM]] backend cuda
// CUDA-NEXT:     hir.send %[[K_S]] to %[[BLOCK]] backend cuda
// CUDA-NEXT:     %[[KB:[^ ]+]] = hir.end_coalescing
// CUDA-NEXT:     hir.start_coalescing
// CUDA-NEXT:     hir.recv %[[V_A]] from %[[FROM]] backend cuda
// CUDA-NEXT:     hir.send %[[V_S]] to %[[BLOCK]] backend cuda
// CUDA-NEXT:     %[[VB:[^ ]+]] = hir.end_coalescing
// CUDA-NEXT:     hir.wait %[[KB]]
// CUDA-NEXT:     hir.wait %[[VB]]
// CUDA-NEXT:     hir.set_current_stream %[[MAIN]]
// The own block, while the shares travel, into the outputs; then the shares that arrived.
// CUDA-NEXT:     %[[K_OWN:[^ ]+]] = hir.alias_select %[[K]][1 = %[[RANK]]]
// CUDA-NEXT:     %[[V_OWN:[^ ]+]] = hir.alias_select %[[V]][1 = %[[RANK]]]
// CUDA-NEXT:     hir.attention_backward causal head_tail block %[[RANK]] ins(%[[DOUT]], %[[Q]], %[[K_OWN]], %[[V_OWN]], %[[OUT]], %[[LSE]] : {{.*}}) outs(%[[DQ]], %[[DK]], %[[DV]] :
// CUDA-NEXT:     %[[K_IN:[^ ]+]] = hir.alias_select %[[K_ARRIVED]][0 = %[[C0]]]
// CUDA-NEXT:     %[[V_IN:[^ ]+]] = hir.alias_select %[[V_ARRIVED]][0 = %[[C0]]]
// CUDA-NEXT:     hir.synchronize_stream %[[STREAM]]
// CUDA-NEXT:     hir.deallocate %[[V_SHARE]]
// CUDA-NEXT:     hir.deallocate %[[K_SHARE]]
// CUDA-NEXT:     hir.launch_kernel @attention_ring_backward_sum_0 ins(%[[DK]], %[[K_IN]] : {{.*}}) outs(%[[DK]] :
// CUDA-NEXT:     hir.deallocate %[[K_ARRIVED]]
// CUDA-NEXT:     hir.launch_kernel @attention_ring_backward_sum_0 ins(%[[DV]], %[[V_IN]] : {{.*}}) outs(%[[DV]] :
// CUDA-NEXT:     hir.deallocate %[[V_ARRIVED]]
// CUDA-NEXT:     hir.launch_kernel @attention_ring_backward_sum_0 ins(%[[DQ]], %[[DQ_SHARE]] : {{.*}}) outs(%[[DQ]] :
// CUDA-NEXT:     hir.deallocate %[[DQ_SHARE]]
// CUDA-NOT:      hir.reduce_scatter
// CUDA:          func.return %[[DQ]], %[[DK]], %[[DV]]
