// RUN: hir-opt %s -p hir-lowering | filecheck %s

// pr4387's Allgather on a mesh of 8: [S, DIDx(8)] -> [Stream(S), 8]. Each iteration
// allgathers one row among the 8 devices and waits for it on its own stream.

!in = !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]>
!out = !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _]>

func.func @allgather(%in: !in) -> !out {
  %out = fusion.set %in : !in -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @allgather(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]>)
// CHECK:         %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
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
// CHECK-NEXT:      %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx]>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.allgather %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]
