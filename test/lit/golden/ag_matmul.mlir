// RUN: hir-opt %s -p 'hir-lowering{per_stream_buffers=false}' | filecheck %s
// RUN: hir-opt %s -p 'hir-lowering{separate_sync_loop=false per_stream_buffers=false}' | filecheck %s --check-prefix=NOSEP
// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefix=PER

// pr4387's AG_matmul on a mesh of 8: A [S, DIDx(8), M, K] @ B [K, N]. insert-reshardings
// gathers A into a stream-parallel buffer; the allgather of chunk i and the matmul
// that reads it share one loop, so the GEMM of chunk i overlaps the allgather of
// chunk i + 1. The gathered buffer is freed after the loop.

!a = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!out = !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>

func.func @ag_matmul(%a: !a, %b: !b) -> !out {
  %out = fusion.matmul %a, %b : (!a, !b) -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @ag_matmul(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, 8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>)
// CHECK:         %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK:         %[[G:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui %[[I]]
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// CHECK-NEXT:      %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[I]]]
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.allgather %[[A_I]] into %[[G_I]] team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[G_I]], %[[B]] : {{.*}}) outs(%[[OUT_I]] :
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[G]]
// CHECK-NEXT:    func.return %[[OUT]]

// Without the separate synchronisation loop (pr4147's form, the one pr4401 found to
// serialise the pipeline): one loop, each stream waits for the caller's at its top.

// NOSEP-LABEL: func.func @ag_matmul(
// NOSEP:         %[[MAIN:[^ ]+]] = hir.get_current_stream
// NOSEP:         scf.for %[[I:[^ ]+]] =
// NOSEP-NEXT:      arith.remui %[[I]]
// NOSEP-NEXT:      %[[S:[^ ]+]] = hir.stream
// NOSEP-NEXT:      hir.set_current_stream %[[S]]
// NOSEP-NEXT:      hir.synchronize_stream %[[MAIN]]
// NOSEP-NEXT:      hir.alias_select
// NOSEP-NEXT:      hir.alias_select
// NOSEP-NEXT:      hir.allgather
// NOSEP-NEXT:      hir.wait
// NOSEP-NEXT:      hir.alias_select
// NOSEP-NEXT:      hir.matmul
// NOSEP-NEXT:      hir.set_current_stream %[[MAIN]]
// NOSEP-NEXT:      hir.synchronize_stream %[[S]]
// NOSEP-NEXT:    }
// NOSEP-NOT:     scf.for
// NOSEP:         func.return

// The default pipeline gives the gathered chunks one slice per stream (per-stream-buffers,
// pr4147's suggested optimisation): iteration i uses slice i mod number_of_streams.

// PER-LABEL: func.func @ag_matmul(
// PER:         %[[SLOTS:[^ ]+]] = arith.minui %{{[^ ]+}}, %{{[^ ]+}} : index
// PER-NEXT:    %[[BUF:[^ ]+]] = hir.allocate(%[[SLOTS]],
// PER:         scf.for
// PER:         scf.for
// PER-NEXT:      %[[SI:[^ ]+]] = arith.remui
// PER:           %[[BUF_I:[^ ]+]] = hir.alias_select %[[BUF]][0 = %[[SI]]]
// PER-NEXT:      hir.allgather %{{[^ ]+}} into %[[BUF_I]]
// PER:           hir.matmul ins(%[[BUF_I]],
