// RUN: hir-opt %s --split-input-file -p stream-parallel,per-stream-buffers | filecheck %s
// RUN: hir-opt %s --split-input-file -p stream-parallel,per-stream-buffers > %t && hir-opt %s --split-input-file -p stream-parallel,per-stream-buffers,per-stream-buffers | diff %t -

// The gathered input of a collective-based AG+GEMM pipeline: each iteration fills its
// slice (the allgather) and reads it (the matmul) on its own stream, so the buffer
// needs one slice per stream, min(extent, number_of_streams) of them, and iteration i
// uses slice i mod number_of_streams. The loops keep the original extent; the
// returned output keeps one slice per iteration.

!a = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [_, didx, _, _]>
!g = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1]>

func.func @ag_matmul(%a: !a, %b: !b) -> !g {
  %s = hir.dim %a, 0 : !a
  %m = hir.dim %a, 2 : !a
  %k = hir.dim %a, 3 : !a
  %n = hir.dim %b, 1 : !b
  %gathered = hir.allocate(%s, %m, %k) : !g
  %work = hir.allgather %a into %gathered team [0, 1] backend nccl : !a, !g
  hir.wait %work
  %out = hir.allocate(%s, %m, %n) : !g
  hir.matmul ins(%gathered, %b : !g, !b) outs(%out : !g)
  func.return %out : !g
}

// CHECK-LABEL: func.func @ag_matmul(
// CHECK-DAG:     %[[NS:[^ ]+]] = hir.number_of_streams
// CHECK-DAG:     %[[S:[^ ]+]] = hir.dim %{{.*}}, 0
// CHECK:         %[[SLOTS:[^ ]+]] = arith.minui %[[S]], %[[NS]] : index
// CHECK-NEXT:    %[[G:[^ ]+]] = hir.allocate(%[[SLOTS]], %{{.*}}, %{{.*}}) : !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _, _]>
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[S]],
// CHECK:         scf.for {{.*}} to %[[S]]
// CHECK:         scf.for %[[I:[^ ]+]] = {{.*}} to %[[S]]
// CHECK-NEXT:      %[[SI:[^ ]+]] = arith.remui %[[I]], %[[NS]]
// CHECK:           %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[SI]]]
// CHECK-NEXT:      hir.allgather %{{.*}} into %[[G_I]]
// CHECK:           hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[G_I]],

// -----

// A static stream extent becomes a dynamic one: min(4, number_of_streams).

!t = !fusion.tensor<[4, 8], f32>
!s = !fusion.tensor<[4, 8], f32, axes = [stream, _]>

func.func @static_extent(%x: !t) -> !s {
  %y = hir.allocate() : !s
  hir.pointwise "neg" ins(%x : !t) outs(%y : !s)
  %z = hir.allocate() : !s
  hir.pointwise "exp" ins(%y : !s) outs(%z : !s)
  func.return %z : !s
}

// CHECK-LABEL: func.func @static_extent(
// CHECK:         %[[C4:[^ ]+]] = arith.constant 4 : index
// CHECK:         %[[SLOTS:[^ ]+]] = arith.minui %[[C4]], %{{[^ ]+}} : index
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[SLOTS]]) : !fusion.tensor<[?, 8], f32, axes = [stream, _]>
// CHECK:         %[[Z:[^ ]+]] = hir.allocate() : !fusion.tensor<[4, 8], f32, axes = [stream, _]>
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK-NEXT:      %[[SI:[^ ]+]] = arith.remui %[[I]],
// CHECK:           %[[Y_I:[^ ]+]] = hir.alias_select %[[Y]][0 = %[[SI]]]
// CHECK-NEXT:      hir.pointwise "neg" ins(%{{.*}}) outs(%[[Y_I]] :
// CHECK:           hir.pointwise "exp" ins(%[[Y_I]] :
// CHECK:           func.return %[[Z]]

// -----

// Left as they are: a buffer that an op outside the loops reads whole (the middle copy
// is not stream-parallel, so it ends the first loop and reads every slice), and the
// returned one.

!t = !fusion.tensor<[?, ?], f32>
!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @kept(%t0: !t) -> !s {
  %d0 = hir.dim %t0, 0 : !t
  %d1 = hir.dim %t0, 1 : !t
  %t1 = hir.allocate(%d0, %d1) : !s
  hir.copy ins(%t0 : !t) outs(%t1 : !s)
  %t2 = hir.allocate(%d0, %d1) : !t
  hir.copy ins(%t1 : !s) outs(%t2 : !t)
  %t3 = hir.allocate(%d0, %d1) : !s
  hir.copy ins(%t2 : !t) outs(%t3 : !s)
  func.return %t3 : !s
}

// CHECK-LABEL: func.func @kept(
// CHECK-NOT:     arith.minui
// CHECK:         func.return

// -----

// A symmetric buffer keeps one slice per iteration: its peers read or write it in their
// own order, not in the order of this device's streams.

!t = !fusion.tensor<[4, 8], f32>
!s = !fusion.tensor<[4, 8], f32, axes = [stream, _]>

func.func @symmetric(%x: !t) -> !s {
  %y = hir.allocate() symmetric : !s
  hir.pointwise "neg" ins(%x : !t) outs(%y : !s)
  %z = hir.allocate() : !s
  hir.pointwise "exp" ins(%y : !s) outs(%z : !s)
  func.return %z : !s
}

// CHECK-LABEL: func.func @symmetric(
// CHECK-NOT:     arith.minui
// CHECK:         %[[Y:[^ ]+]] = hir.allocate() symmetric : !fusion.tensor<[4, 8], f32, axes = [stream, _]>
// CHECK-NOT:     arith.minui
// CHECK:         func.return
