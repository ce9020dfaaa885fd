// RUN: hir-opt %s -p stream-parallel | filecheck %s
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -

// The collective-based pipelines of pr4387: each iteration communicates one slice,
// and its hir.wait moves into the loop with it.

!in = !fusion.tensor<[?, 4], f32, mesh = [0, 1, 2, 3], axes = [_, didx]>
!out = !fusion.tensor<[?, 4], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>

func.func @allgather(%in: !in) -> !out {
  %s = hir.dim %in, 0 : !in
  %out = hir.allocate(%s) : !out
  %w = hir.allgather %in into %out team [0, 1, 2, 3] backend nccl : !in, !out
  hir.wait %w
  func.return %out : !out
}

// CHECK-LABEL: func.func @allgather(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 4], f32, mesh = [0, 1, 2, 3], axes = [_, didx]>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 0
// CHECK-NEXT:    scf.for %{{.*}} to %[[N]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = %{{.*}} to %[[N]]
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3], axes = [didx]>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[4], f32, mesh = [0, 1, 2, 3]>
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.allgather %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3] backend nccl
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]

!rin = !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _]>
!rout = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>

func.func @allreduce(%in: !rin) -> !rout {
  %s = hir.dim %in, 0 : !rin
  %m = hir.dim %in, 2 : !rin
  %out = hir.allocate(%s, %m) : !rout
  %w = hir.allreduce %in into %out team [0, 1, 2, 3] op sum backend nccl : !rin, !rout
  hir.wait %w
  func.return %out : !rout
}

// CHECK-LABEL: func.func @allreduce(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _]>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3]>
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.allreduce %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3] op sum backend nccl
// CHECK-NEXT:      hir.wait %[[W]]

!sin = !fusion.tensor<[?, 4, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!sout = !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _]>

func.func @reduce_scatter(%in: !sin) -> !sout {
  %s = hir.dim %in, 0 : !sin
  %m = hir.dim %in, 3 : !sin
  %out = hir.allocate(%s, %m) : !sout
  %w = hir.reduce_scatter %in into %out team [0, 1, 2, 3] op sum backend nccl : !sin, !sout
  hir.wait %w
  func.return %out : !sout
}

// CHECK-LABEL: func.func @reduce_scatter(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, 4, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[4, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.reduce_scatter %[[IN_I]] into %[[OUT_I]] team [0, 1, 2, 3] op sum backend nccl
// CHECK-NEXT:      hir.wait %[[W]]

// pr4387's matmul_AR: a K-sharded matmul and the allreduce of its partial sums share
// one loop; each iteration reduces the slice its matmul just wrote.

!a = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!b = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!p = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _]>
!r = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>

func.func @matmul_allreduce(%a: !a, %b: !b) -> !r {
  %s = hir.dim %a, 0 : !a
  %m = hir.dim %a, 2 : !a
  %n = hir.dim %b, 2 : !b
  %p = hir.allocate(%s, %m, %n) : !p
  hir.matmul ins(%a, %b : !a, !b) outs(%p : !p)
  %r = hir.allocate(%s, %m, %n) : !r
  %w = hir.allreduce %p into %r team [0, 1, 2, 3] op sum backend nccl : !p, !r
  hir.wait %w
  func.return %r : !r
}

// CHECK-LABEL: func.func @matmul_allreduce(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>)
// CHECK:         %[[P:[^ ]+]] = hir.allocate
// CHECK:         %[[R:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// CHECK-NEXT:      %[[P_I:[^ ]+]] = hir.alias_select %[[P]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[A_I]], %[[B]] : {{.*}}) outs(%[[P_I]] :
// CHECK-NEXT:      %[[R_I:[^ ]+]] = hir.alias_select %[[R]][0 = %[[I]]]
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.allreduce %[[P_I]] into %[[R_I]] team [0, 1, 2, 3] op sum backend nccl
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[R]]
