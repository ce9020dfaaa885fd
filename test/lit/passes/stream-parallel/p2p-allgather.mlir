// RUN: hir-opt %s -p stream-parallel | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda}' | filecheck %s --check-prefixes=CHECK,CUDA
// RUN: hir-opt %s -p 'stream-parallel{p2p_order=device}' | filecheck %s --check-prefix=DEVICE
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -
// RUN: hir-opt %s -p 'stream-parallel{p2p_order=device}' > %t.device && hir-opt %s -p 'stream-parallel{p2p_order=device},stream-parallel{p2p_order=device}' | diff %t.device -

// The point-to-point allgather: an allgather from the input's didx axis to the
// output's stream axis, in ring order. With p the device's position in the mesh and
// D = 8, iteration i works on slot s = (p + i) mod D: at i == 0 the device copies its
// own shard there; otherwise, in one batch, it receives slot s from device s and sends
// its own shard to device (p + D - i) mod D, whose slot in iteration i is p. (p + D - i)
// keeps the unsigned index arithmetic from wrapping; p + D is computed once, before
// the loops. The allgather's wait goes; the batch has its own. With the copy engines
// (cuda) peers read the shard, so an input is first copied into a symmetric buffer,
// before the loops. p2p_order=device is pr4515's order (DEVICE): iteration i fills
// slice i with the shard of device i, which every other device exchanges with it.

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
// CHECK-NEXT:    %[[C8:[^ ]+]] = arith.constant 8 : index
// CHECK-NEXT:    hir.dim
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CUDA-NEXT:     hir.dim %[[IN]], 1
// CUDA-NEXT:     %[[STAGED:[^ ]+]] = hir.allocate(%{{.*}}) symmetric : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// CUDA-NEXT:     hir.copy ins(%[[IN]] : {{.*}}) outs(%[[STAGED]] :
// CHECK-NEXT:    %[[WRAPPED:position_plus_size]] = arith.addi %[[RANK]], %[[C8]] : index
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 0
// CHECK-NEXT:    scf.for %{{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = %{{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui %[[I]]
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[AHEAD:ahead]] = arith.addi %[[RANK]], %[[I]] : index
// CHECK-NEXT:      %[[SLOT:slot]] = arith.remui %[[AHEAD]], %[[C8]] : index
// CHECK-NEXT:      %[[OUT_S:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[SLOT]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:      %[[OWN:is_own]] = arith.cmpi eq, %[[I]], %[[C0]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// NCCL-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CUDA-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[OUT_S]] :
// CHECK-NEXT:      } else {
// CHECK-NEXT:        %[[BEHIND:behind]] = arith.subi %[[WRAPPED]], %[[I]] : index
// CHECK-NEXT:        %[[SEND_PEER:send_peer]] = arith.remui %[[BEHIND]], %[[C8]] : index
// CHECK-NEXT:        hir.start_coalescing
// NCCL-NEXT:         hir.recv %[[OUT_S]] from %[[SLOT]] backend nccl
// NCCL-NEXT:         hir.send %[[IN]] to %[[SEND_PEER]] backend nccl
// CUDA-NEXT:         hir.recv %[[OUT_S]] from %[[SLOT]] backend cuda
// CUDA-NEXT:         hir.send %[[STAGED]] to %[[SEND_PEER]] backend cuda
// CHECK-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        hir.wait %[[BATCH]]
// CHECK-NEXT:      }
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]

// DEVICE-LABEL: func.func @allgather_p2p(
// DEVICE-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>)
// DEVICE-NEXT:    %[[C0:[^ ]+]] = arith.constant 0 : index
// DEVICE-NEXT:    arith.constant 1 : index
// DEVICE-NEXT:    %[[MAIN:[^ ]+]] = hir.get_current_stream
// DEVICE-NEXT:    hir.number_of_streams
// DEVICE-NEXT:    %[[RANK:[^ ]+]] = hir.device_index
// DEVICE-NEXT:    hir.dim
// DEVICE-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// DEVICE-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 0
// DEVICE-NEXT:    scf.for %{{.*}} to %[[N]]
// DEVICE-NEXT:      arith.remui
// DEVICE-NEXT:      hir.stream
// DEVICE-NEXT:      hir.set_current_stream
// DEVICE-NEXT:      hir.synchronize_stream %[[MAIN]]
// DEVICE-NEXT:    }
// DEVICE-NEXT:    scf.for %[[I:[^ ]+]] = %{{.*}} to %[[N]]
// DEVICE-NEXT:      arith.remui
// DEVICE-NEXT:      %[[S:[^ ]+]] = hir.stream
// DEVICE-NEXT:      hir.set_current_stream %[[S]]
// DEVICE-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// DEVICE-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[RANK]] : index
// DEVICE-NEXT:      scf.if %[[OWN]] {
// DEVICE-NEXT:        %[[SHARD:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// DEVICE-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[OUT_I]] :
// DEVICE-NEXT:      } else {
// DEVICE-NEXT:        hir.start_coalescing
// DEVICE-NEXT:        hir.recv %[[OUT_I]] from %[[I]] backend nccl
// DEVICE-NEXT:        hir.send %[[IN]] to %[[I]] backend nccl
// DEVICE-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// DEVICE-NEXT:        hir.wait %[[BATCH]]
// DEVICE-NEXT:      }
// DEVICE-NEXT:      hir.set_current_stream %[[MAIN]]
// DEVICE-NEXT:      hir.synchronize_stream %[[S]]
// DEVICE-NEXT:    }
// DEVICE-NEXT:    func.return %[[OUT]]

// An input that the caller passes in symmetric memory (`hir.symmetric`) is what the
// copy engines read: no symmetric copy of it before the loops.

func.func @allgather_p2p_symmetric(%in: !in {hir.symmetric}) -> !out {
  %m = hir.dim %in, 1 : !in
  %out = hir.allocate(%m) : !out
  %w = hir.allgather %in into %out team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl : !in, !out
  hir.wait %w
  func.return %out : !out
}

// CUDA-LABEL: func.func @allgather_p2p_symmetric(
// CUDA-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]> {hir.symmetric})
// CUDA-NOT:       hir.allocate({{.*}}) symmetric
// CUDA:           %[[SHARD:[^ ]+]] = hir.alias_select %[[IN]][0 = %{{.*}}]
// CUDA-NEXT:      hir.copy ins(%[[SHARD]] : {{.*}}) outs(
// CUDA:           hir.send %[[IN]] to %{{.*}} backend cuda
// CUDA-NOT:       hir.copy
// CUDA:           func.return

// pr4515's AG_matmul_P2p: the matmul of each gathered slice runs in the same loop, on
// the slot that the iteration has just received (its loop merges into the ring's with
// the slot for its induction variable). In device order, on row i.

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
// CHECK:           %[[SLOT:slot]] = arith.remui %{{.*}}, %{{.*}} : index
// CHECK-NEXT:      %[[G_S:[^ ]+]] = hir.alias_select %[[G]][0 = %[[SLOT]]]
// CHECK-NEXT:      arith.cmpi eq, %[[I]]
// CHECK-NEXT:      scf.if
// CHECK:             hir.copy ins(%{{.*}}) outs(%[[G_S]] :
// CHECK:             hir.recv %[[G_S]] from %[[SLOT]]
// NCCL-NEXT:         hir.send %[[A]] to %{{.*}}
// CUDA-NEXT:         hir.send %[[A]]_symmetric to %{{.*}}
// CHECK:           }
// CHECK-NEXT:      %[[C_S:[^ ]+]] = hir.alias_select %[[C]][0 = %[[SLOT]]]
// CHECK-NEXT:      hir.matmul ins(%[[G_S]], %[[B]] : {{.*}}) outs(%[[C_S]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NOT:     hir.wait
// CHECK:         func.return %[[C]]

// DEVICE-LABEL: func.func @ag_matmul_p2p(
// DEVICE:         scf.for
// DEVICE:         scf.for %[[I:[^ ]+]] =
// DEVICE:           %[[G_I:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[I]]]
// DEVICE:             hir.recv %[[G_I]] from %[[I]]
// DEVICE:           %[[C_I:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[I]]]
// DEVICE-NEXT:      hir.matmul ins(%[[G_I]], %{{.*}} : {{.*}}) outs(%[[C_I]] :

// On a mesh that starts at device 4, the position of a device is its index minus 4,
// computed once before the loops, and the peers are slots plus 4. A copy from didx to
// stream is the same point-to-point allgather.

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
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// CHECK-DAG:     %[[C4:[^ ]+]] = arith.constant 4 : index
// CHECK:         %[[POSITION:position]] = arith.subi %[[RANK]], %[[C4]] : index
// CHECK-NEXT:    %[[WRAPPED:[^ ]+]] = arith.addi %[[POSITION]], %[[C4]] : index
// CHECK-NEXT:    hir.dim
// CHECK-NEXT:    scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[AHEAD:[^ ]+]] = arith.addi %[[POSITION]], %[[I]] : index
// CHECK-NEXT:      %[[SLOT:[^ ]+]] = arith.remui %[[AHEAD]], %[[C4]] : index
// CHECK-NEXT:      %[[OUT_S:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[SLOT]]]
// CHECK-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[C0]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// CHECK:           } else {
// CHECK-NEXT:        %[[RECV_PEER:recv_peer]] = arith.addi %[[SLOT]], %[[C4]] : index
// CHECK-NEXT:        %[[BEHIND:[^ ]+]] = arith.subi %[[WRAPPED]], %[[I]] : index
// CHECK-NEXT:        %[[SEND_SLOT:send_slot]] = arith.remui %[[BEHIND]], %[[C4]] : index
// CHECK-NEXT:        %[[SEND_PEER:send_peer]] = arith.addi %[[SEND_SLOT]], %[[C4]] : index
// CHECK-NEXT:        hir.start_coalescing
// CHECK-NEXT:        hir.recv %[[OUT_S]] from %[[RECV_PEER]]
// NCCL-NEXT:         hir.send %[[IN]] to %[[SEND_PEER]]
// CUDA-NEXT:         hir.send %[[IN]]_symmetric to %[[SEND_PEER]]

// In device order, iteration i exchanges with device i + 4.

// DEVICE-LABEL: func.func @copy_p2p_upper_mesh(
// DEVICE-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32, mesh = [4, 5, 6, 7], axes = [didx, _]>)
// DEVICE-DAG:     %[[C4:[^ ]+]] = arith.constant 4 : index
// DEVICE-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// DEVICE:         scf.for
// DEVICE:         scf.for %[[I:[^ ]+]] =
// DEVICE:           %[[OUT_I:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[I]]]
// DEVICE-NEXT:      %[[PEER:[^ ]+]] = arith.addi %[[I]], %[[C4]] : index
// DEVICE-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[PEER]], %[[RANK]] : index
// DEVICE-NEXT:      scf.if %[[OWN]] {
// DEVICE:             hir.recv %[[OUT_I]] from %[[PEER]]
// DEVICE-NEXT:        hir.send %[[IN]] to %[[PEER]]

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
// CHECK:         hir.recv %{{.*}} from %[[SLOT:[^ ]+]] backend cuda
// CHECK-NEXT:    hir.send %[[Y]] to %[[PEER:[^ ]+]] backend cuda

// DEVICE-LABEL: func.func @computed_copy_engine(
// DEVICE:         %[[Y:[^ ]+]] = hir.allocate(%{{.*}}) symmetric :
// DEVICE:         hir.recv %{{.*}} from %[[I:[^ ]+]] backend cuda
// DEVICE-NEXT:    hir.send %[[Y]] to %[[I]] backend cuda
