// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefixes=CHECK,PER
// RUN: hir-opt %s -p 'hir-lowering{per_stream_buffers=false}' | filecheck %s --check-prefixes=CHECK,REF

// pr3736's AG+GEMM overlap on a mesh of 8, with pr4401's separate synchronisation
// loop: chunk i of the input is allgathered on stream i mod number_of_streams and
// fed to the linear (weight and bias whole) on the same stream. The gathered chunks
// take one slice per stream (per-stream-buffers): iteration i gathers into slice
// i mod number_of_streams; with per_stream_buffers=false, one slice per chunk as in pr3736.
// in [S, DIDx(8), M, K], weight [N, K], bias [N] -> [Stream(S), 8, M, N].

!in = !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!b = !fusion.tensor<[?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!out = !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>

func.func @ag_linear(%in: !in, %w: !w, %b: !b) -> !out {
  %out = fusion.linear %in, %w, %b : (!in, !w, !b) -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @ag_linear(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>, %[[W:[^:]+]]: !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>, %[[B:[^:]+]]: !fusion.tensor<[?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>)
// CHECK:         %[[MAIN:[^ ]+]] = hir.get_current_stream
// PER:           %[[N:[^ ]+]] = hir.dim %[[IN]], 0
// PER:           %[[SLOTS:[^ ]+]] = arith.minui %[[N]], %{{[^ ]+}} : index
// PER-NEXT:      %[[G:[^ ]+]] = hir.allocate(%[[SLOTS]], {{.*}}) : !fusion.tensor<[?, 8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _, _]>
// REF:           %[[G:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK-NEXT:      %[[SI:[^ ]+]] = arith.remui %[[I]]
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// PER-NEXT:        %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[SI]]] : {{.*}} -> !fusion.tensor<[8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// REF-NEXT:        %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, ?, ?], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:      %[[WORK:[^ ]+]] = hir.allgather %[[IN_I]] into %[[G_I]] team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl
// CHECK-NEXT:      hir.wait %[[WORK]]
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      hir.linear ins(%[[G_I]], %[[W]], %[[B]] : {{.*}}) outs(%[[OUT_I]] :
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[G]]
// CHECK-NEXT:    func.return %[[OUT]]
