// RUN: hir-opt %s -p hir-lowering | filecheck %s

// pr4387's Allreduce on a mesh of 8: [S, DIDx(8), M] -> sum(1) -> [Stream(S), M]. Each
// iteration allreduces one [DIDx(8), M] slice into one row.

!in = !fusion.tensor<[?, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _]>
!out = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _]>

func.func @allreduce(%in: !in) -> !out {
  %out = fusion.sum %in [1] : !in -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @allreduce(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx, _]>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.allreduce %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]
