// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda}' | filecheck %s --check-prefixes=CHECK,CUDA

// pr4387's ReduceScatter on a mesh of 8: [S, DIDx(8), 8, M] -> sum(1) ->
// [Stream(S), DIDx(8), M]. Each iteration reduce-scatters one slice. With the copy
// engines (backend=cuda) peers read the input, which the caller allocated: it is
// copied into a symmetric buffer once, before the loops, and each iteration
// reduce-scatters a slice of that copy.

!in = !fusion.tensor<[?, 8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
!out = !fusion.tensor<[?, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _]>

func.func @reduce_scatter(%in: !in) -> !out {
  %out = fusion.sum %in [1] : !in -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @reduce_scatter(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>)
// CUDA:          %[[STAGED:[^ ]+]] = hir.allocate({{.*}}) symmetric : !fusion.tensor<[?, 8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _, _]>
// CUDA-NEXT:     hir.copy ins(%[[IN]] : {{.*}}) outs(%[[STAGED]] :
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 0
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// NCCL:            %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// CUDA:            %[[IN_I:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// NCCL-NEXT:       %[[W:[^ ]+]] = hir.reduce_scatter %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CUDA-NEXT:       %[[W:[^ ]+]] = hir.reduce_scatter %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend cuda
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// NCCL-NEXT:     func.return %[[OUT]]
// CUDA-NEXT:     hir.deallocate %[[STAGED]]
// CUDA-NEXT:     func.return %[[OUT]]
