// RUN: hir-opt %s -p stream-parallel | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda}' | filecheck %s --check-prefixes=CHECK,CUDA
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -

// pr4515's point-to-point allgather: an allgather from the input's didx axis to the
// output's stream axis. Iteration i fills slice i with the shard of device i: that
// device copies its own shard, every other one receives it and, in the same batch,
// sends its own shard to device i. The allgather's wait goes; the batch has its own.
// With the copy engines (cuda) peers read the shard, so an input is first copied into
// a symmetric buffer, before the loops.

!in = !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
!out = !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _]>

func.func @allgather_p2p(%in: !in) -> !out {
  %m = hir.dim %in, 1 : !in
  %out = hir.allocate(%m) : !out
  %w = hir.allgather %in into %out team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl : !in, !out
  hir.wait %w
  func.return %out : !out
}

// CHECK-LABEL: func.func @allgather_p2p(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>)
// CHECK-NEXT:    %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-NEXT:    arith.constant 1 : index
// CHECK-NEXT:    %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK-NEXT:    hir.number_of_streams
// CHECK-NEXT:    %[[RANK:[^ ]+]] = hir.device_index
// CHECK-NEXT:    hir.dim
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CUDA-NEXT:     hir.dim %[[IN]], 1
// CUDA-NEXT:     %[[STAGED:[^ ]+]] = hir.allocate(%{{.*}}) symmetric : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// CUDA-NEXT:     hir.copy ins(%[[IN]] : {{.*}}) outs(%[[STAGED]] :
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 0
// CHECK-NEXT:    scf.for %{{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = %{{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[RANK]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// NCCL-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CUDA-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[OUT_I]] :
// CHECK-NEXT:      } else {
// CHECK-NEXT:        hir.start_coalescing
// NCCL-NEXT:         hir.recv %[[OUT_I]] from %[[I]] backend nccl
// NCCL-NEXT:         hir.send %[[IN]] to %[[I]] backend nccl
// CUDA-NEXT:         hir.recv %[[OUT_I]] from %[[I]] backend cuda
// CUDA-NEXT:         hir.send %[[STAGED]] to %[[I]] backend cuda
// CHECK-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        hir.wait %[[BATCH]]
// CHECK-NEXT:      }
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]

// pr4515's AG_matmul_P2p: the matmul of each gathered slice runs in the same loop.

!a = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
!g = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>

func.func @ag_matmul_p2p(%a: !a, %b: !b) -> !g {
  %m = hir.dim %a, 1 : !a
  %k = hir.dim %a, 2 : !a
  %g = hir.allocate(%m, %k) : !g
  %w = hir.allgather %a into %g team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl : !a, !g
  hir.wait %w
  %n = hir.dim %b, 1 : !b
  %c = hir.allocate(%m, %n) : !g
  hir.matmul ins(%g, %b : !g, !b) outs(%c : !g)
  func.return %c : !g
}

// CHECK-LABEL: func.func @ag_matmul_p2p(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>)
// CHECK:         %[[G:[^ ]+]] = hir.allocate
// CHECK:         %[[C:[^ ]+]] = hir.allocate({{.*}}) :
// CHECK-NEXT:    scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[I]]]
// CHECK-NEXT:      arith.cmpi eq, %[[I]]
// CHECK-NEXT:      scf.if
// CHECK:             hir.copy ins(%{{.*}}) outs(%[[G_I]] :
// CHECK:             hir.recv %[[G_I]] from %[[I]]
// NCCL-NEXT:         hir.send %[[A]] to %[[I]]
// CUDA-NEXT:         hir.send %[[A]]_symmetric to %[[I]]
// CHECK:           }
// CHECK-NEXT:      %[[C_I:[^ ]+]] = hir.alias_select %[[C]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[G_I]], %[[B]] : {{.*}}) outs(%[[C_I]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NOT:     hir.wait
// CHECK:         func.return %[[C]]

// On a mesh that starts at device 4, iteration i exchanges with device i + 4. A
// copy from didx to stream is the same point-to-point allgather.

!hin = !fusion.tensor<[?, ?], f32, mesh = [4, 5, 6, 7], axes = [didx, _]>
!hout = !fusion.tensor<[?, ?], f32, mesh = [4, 5, 6, 7], axes = [stream, _]>

func.func @copy_p2p_upper_mesh(%in: !hin) -> !hout {
  %d = hir.dim %in, 0 : !hin
  %m = hir.dim %in, 1 : !hin
  %out = hir.allocate(%d, %m) : !hout
  hir.copy ins(%in : !hin) outs(%out : !hout)
  func.return %out : !hout
}

// CHECK-LABEL: func.func @copy_p2p_upper_mesh(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32, mesh = [4, 5, 6, 7], axes = [didx, _]>)
// CHECK-DAG:     %[[C4:[^ ]+]] = arith.constant 4 : index
// CHECK-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[OUT_I:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[I]]]
// CHECK-NEXT:      %[[PEER:[^ ]+]] = arith.addi %[[I]], %[[C4]] : index
// CHECK-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[PEER]], %[[RANK]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// CHECK:             hir.recv %[[OUT_I]] from %[[PEER]]
// NCCL-NEXT:         hir.send %[[IN]] to %[[PEER]]
// CUDA-NEXT:         hir.send %[[IN]]_symmetric to %[[PEER]]

// An allgather that asks for the copy engines keeps them in its point-to-point form,
// whatever p2p_backend says. Its input, a buffer the program computes and does not
// return, becomes symmetric where it is allocated, with no copy.

func.func @computed_copy_engine(%x: !in) -> !out {
  %m = hir.dim %x, 1 : !in
  %y = hir.allocate(%m) : !in
  hir.pointwise "neg" ins(%x : !in) outs(%y : !in)
  %out = hir.allocate(%m) : !out
  %w = hir.allgather %y into %out team [0, 1, 2, 3, 4, 5, 6, 7] backend cuda : !in, !out
  hir.wait %w
  func.return %out : !out
}

// CHECK-LABEL: func.func @computed_copy_engine(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate(%{{.*}}) symmetric : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// CHECK-NEXT:    hir.pointwise "neg" ins(%{{.*}} : {{.*}}) outs(%[[Y]] :
// CHECK-NOT:     hir.copy ins(%[[Y]]
// CHECK:         hir.recv %{{.*}} from %[[I:[^ ]+]] backend cuda
// CHECK-NEXT:    hir.send %[[Y]] to %[[I]] backend cuda
