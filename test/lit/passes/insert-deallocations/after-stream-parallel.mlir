// RUN: hir-opt %s -p stream-parallel,insert-deallocations | filecheck %s

// nvFuser's ThreeSetOpsWithDisjointsForLoops after stream-parallel: a buffer that a
// loop slices is freed after the whole loop, once every stream has been waited for.

!t = !fusion.tensor<[?, ?], f32>
!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @three_sets(%t0: !t) -> !s {
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

// CHECK-LABEL: func.func @three_sets(
// CHECK:         %[[T1:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[T2:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.copy ins(%[[T1]] : {{.*}}) outs(%[[T2]] :
// CHECK-NEXT:    hir.deallocate %[[T1]]
// CHECK:         scf.for
// CHECK:         scf.for
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[T2]]
// CHECK-NEXT:    func.return
