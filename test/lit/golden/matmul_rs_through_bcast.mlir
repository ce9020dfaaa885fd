// RUN: hir-opt %s -p 'hir-lowering{per_stream_buffers=false forward_buffers=false}' | filecheck %s --check-prefixes=CHECK,REF
// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefix=PER

// pr4387's matmul_RS_through_bcast on a mesh of 8. The broadcast of the weight is not
// stream-parallel: it runs once, before the loops (nvFuser's PostOnStream of a
// HostUnit). In the loop the matmul reads the broadcast weight at index 0 of its
// extent-1 axis in every iteration (nvFuser slices that axis at StreamIdx, out of
// range past the first iteration), and its partial sums are reduce-scattered. With
// forward_buffers=false, the broadcast's out gets the view of the weight copied in, as in
// the reference program; the default pipeline marks it `adopted`: the out is the view.

!a = !fusion.tensor<[?, 8, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _, _]>
!b = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
!bb = !fusion.tensor<[1, 8, 1, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _, _]>
!partial = !fusion.tensor<[?, 8, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _, _]>
!out = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _, _]>

func.func @matmul_rs_through_bcast(%a: !a, %b: !b) -> !out {
  %bb = fusion.broadcast %b [0, 2] : !b -> !bb
  %partial = fusion.matmul %a, %bb : (!a, !bb) -> !partial
  %out = fusion.sum %partial [1] : !partial -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func private @matmul_rs_through_bcast_segment_0(
// CHECK:         fusion.broadcast %{{.*}} [0, 2]

// CHECK-LABEL: func.func @matmul_rs_through_bcast(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, 8, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>)
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK:         %[[BB:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.post_on_stream @matmul_rs_through_bcast_segment_0 ins(%[[B]] : {{.*}}) outs(%[[BB]] :
// REF-NOT:       adopted
// CHECK-NEXT:    %[[P:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// CHECK-NEXT:      %[[BB_0:[^ ]+]] = hir.alias_select %[[BB]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[8, 1, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _, _]>
// CHECK-NEXT:      %[[P_I:[^ ]+]] = hir.alias_select %[[P]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[A_I]], %[[BB_0]] : {{.*}}) outs(%[[P_I]] :
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.reduce_scatter %[[P_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-DAG:     hir.deallocate %[[P]]
// CHECK-DAG:     hir.deallocate %[[BB]]
// CHECK-NEXT:    func.return %[[OUT]]

// The default pipeline gives the partial sums one slice per stream (per-stream-buffers,
// pr4147's suggested optimisation): iteration i uses slice i mod number_of_streams.

// PER-LABEL: func.func @matmul_rs_through_bcast(
// PER:         hir.post_on_stream @matmul_rs_through_bcast_segment_0 ins(%{{[^ ]+}} : {{.*}}) outs(%{{[^ ]+}} : {{[^)]*}}) adopted [0]{{$}}
// PER:         %[[SLOTS:[^ ]+]] = arith.minui %{{[^ ]+}}, %{{[^ ]+}} : index
// PER-NEXT:    %[[BUF:[^ ]+]] = hir.allocate(%[[SLOTS]],
// PER:         scf.for
// PER:         scf.for
// PER-NEXT:      %[[SI:[^ ]+]] = arith.remui
// PER:           %[[BUF_I:[^ ]+]] = hir.alias_select %[[BUF]][0 = %[[SI]]]
// PER-NEXT:      hir.matmul ins({{.*}}) outs(%[[BUF_I]] :
// PER:           hir.reduce_scatter %[[BUF_I]] into
