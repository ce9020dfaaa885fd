// RUN: hir-opt %s -p 'stream-parallel{separate_sync_loop=false}' | filecheck %s
// RUN: hir-opt %s -p 'stream-parallel{separate_sync_loop=false}' > %t && hir-opt %s -p 'stream-parallel{separate_sync_loop=false},stream-parallel{separate_sync_loop=false}' | diff %t -

// Without a separate synchronisation loop, each iteration's stream waits for the
// caller's stream at the top of the work loop (pr4147's form). Loops still merge.

!t = !fusion.tensor<[?, ?], f32>
!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @two_sets(%t0: !t) -> !s {
  %d0 = hir.dim %t0, 0 : !t
  %d1 = hir.dim %t0, 1 : !t
  %t1 = hir.allocate(%d0, %d1) : !s
  hir.copy ins(%t0 : !t) outs(%t1 : !s)
  %t2 = hir.allocate(%d0, %d1) : !s
  hir.copy ins(%t1 : !s) outs(%t2 : !s)
  func.return %t2 : !s
}

// CHECK-LABEL: func.func @two_sets(
// CHECK-SAME:      %[[T0:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK-NEXT:    %[[NS:[^ ]+]] = hir.number_of_streams
// CHECK:         %[[T1:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[T1]], 0
// CHECK-NEXT:    %[[T2:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = %{{.*}} to %[[N]] step %{{.*}} {
// CHECK-NEXT:      %[[J:[^ ]+]] = arith.remui %[[I]], %[[NS]] : index
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream %[[J]]
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:      %[[T0_I:[^ ]+]] = hir.alias_select %[[T0]][0 = %[[I]]]
// CHECK-NEXT:      %[[T1_I:[^ ]+]] = hir.alias_select %[[T1]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[T0_I]] : {{.*}}) outs(%[[T1_I]] :
// CHECK-NEXT:      %[[T2_I:[^ ]+]] = hir.alias_select %[[T2]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[T1_I]] : {{.*}}) outs(%[[T2_I]] :
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[T2]]
