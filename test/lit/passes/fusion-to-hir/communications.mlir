// RUN: hir-opt %s -p fusion-to-hir | filecheck %s
// RUN: hir-opt %s -p fusion-to-hir > %t && hir-opt %t -p fusion-to-hir | diff %t -

// Every communication a sharding change becomes, at mesh size 8 and 3: each writes a
// buffer allocated right before it, and the program waits for it. Teams list the
// mesh's devices in order, then a root outside the mesh.

// didx -> replicated on the same mesh: allgather.

func.func @allgather_8(%x: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>) -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]> {
  %y = fusion.set %x : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]> -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
  func.return %y : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
}

// CHECK-LABEL: func.func @allgather_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allgather %x into %[[Y]] team [0, 1, 2, 3, 4, 5, 6, 7] backend nccl
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[Y]]

// A sum over the didx axis into a replicated result: allreduce.

func.func @allreduce_8(%x: !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]>) -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]> {
  %y = fusion.sum %x [1] : !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]> -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
  func.return %y : !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
}

// CHECK-LABEL: func.func @allreduce_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allreduce %x into %[[Y]] team [0, 1, 2, 3, 4, 5, 6, 7] op sum backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// A max over the didx axis into a result sharded on another axis: reduce_scatter.

func.func @reduce_scatter_8(%x: !fusion.tensor<[8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>) -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]> {
  %y = fusion.max %x [0] : !fusion.tensor<[8, 8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]> -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
  func.return %y : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
}

// CHECK-LABEL: func.func @reduce_scatter_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.reduce_scatter %x into %[[Y]] team [0, 1, 2, 3, 4, 5, 6, 7] op max backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// One device -> sharded on a mesh: scatter from that root.

func.func @scatter_8(%x: !fusion.tensor<[8, ?], f32>) -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]> {
  %y = fusion.set %x : !fusion.tensor<[8, ?], f32> -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
  func.return %y : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
}

// CHECK-LABEL: func.func @scatter_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.scatter %x into %[[Y]] team [0, 1, 2, 3, 4, 5, 6, 7] root 0 backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// A root outside the mesh joins the team last.

func.func @scatter_outside_8(%x: !fusion.tensor<[8, ?], f32, mesh = [8]>) -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]> {
  %y = fusion.set %x : !fusion.tensor<[8, ?], f32, mesh = [8]> -> !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
  func.return %y : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
}

// CHECK-LABEL: func.func @scatter_outside_8(
// CHECK:         hir.scatter %x into %{{[^ ]+}} team [0, 1, 2, 3, 4, 5, 6, 7, 8] root 8 backend nccl

// Replicated -> sharded on the same devices: each keeps slice (device - 0).

func.func @local_slice_8(%x: !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>) -> !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]> {
  %y = fusion.set %x : !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]> -> !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]>
  func.return %y : !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]>
}

// CHECK-LABEL: func.func @local_slice_8(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    %[[DEVICE:[^ ]+]] = hir.device_index
// CHECK-NEXT:    %[[FIRST:[^ ]+]] = arith.constant 0 : index
// CHECK-NEXT:    %[[I:[^ ]+]] = arith.subi %[[DEVICE]], %[[FIRST]] : index
// CHECK-NEXT:    %[[ZERO:[^ ]+]] = arith.constant 0 : index
// CHECK-NEXT:    %[[WHOLE:[^ ]+]] = hir.alias_select %x[1 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:    %[[SHARD:[^ ]+]] = hir.alias_select %[[Y]][1 = %[[ZERO]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:    hir.copy ins(%[[WHOLE]] : {{.*}}) outs(%[[SHARD]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]]

// Sharded -> one device: gather to that root.

func.func @gather_8(%x: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>) -> !fusion.tensor<[8, ?], f32, mesh = [1]> {
  %y = fusion.set %x : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]> -> !fusion.tensor<[8, ?], f32, mesh = [1]>
  func.return %y : !fusion.tensor<[8, ?], f32, mesh = [1]>
}

// CHECK-LABEL: func.func @gather_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.gather %x into %[[Y]] team [0, 1, 2, 3, 4, 5, 6, 7] root 1 backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// One device -> replicated on a mesh: broadcast from that root.

func.func @broadcast_8(%x: !fusion.tensor<[?, 5], f32, mesh = [2]>) -> !fusion.tensor<[?, 5], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]> {
  %y = fusion.set %x : !fusion.tensor<[?, 5], f32, mesh = [2]> -> !fusion.tensor<[?, 5], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
  func.return %y : !fusion.tensor<[?, 5], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
}

// CHECK-LABEL: func.func @broadcast_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.broadcast %x into %[[Y]] team [0, 1, 2, 3, 4, 5, 6, 7] root 2 backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// A sum over the didx axis onto one device: reduce to that root.

func.func @reduce_8(%x: !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]>) -> !fusion.tensor<[?], f32, mesh = [7]> {
  %y = fusion.sum %x [1] : !fusion.tensor<[?, 8], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [_, didx]> -> !fusion.tensor<[?], f32, mesh = [7]>
  func.return %y : !fusion.tensor<[?], f32, mesh = [7]>
}

// CHECK-LABEL: func.func @reduce_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.reduce %x into %[[Y]] team [0, 1, 2, 3, 4, 5, 6, 7] root 7 op sum backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// Same layout on another mesh of the same size: one send_recv per device pair.

func.func @send_recv_8(%x: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>) -> !fusion.tensor<[8, ?], f32, mesh = [8, 9, 10, 11, 12, 13, 14, 15], axes = [didx, _]> {
  %y = fusion.set %x : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]> -> !fusion.tensor<[8, ?], f32, mesh = [8, 9, 10, 11, 12, 13, 14, 15], axes = [didx, _]>
  func.return %y : !fusion.tensor<[8, ?], f32, mesh = [8, 9, 10, 11, 12, 13, 14, 15], axes = [didx, _]>
}

// CHECK-LABEL: func.func @send_recv_8(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W0:[^ ]+]] = hir.send_recv %x into %[[Y]] team [0, 8] root 0 backend nccl
// CHECK-NEXT:    hir.wait %[[W0]]
// CHECK-NEXT:    %[[W1:[^ ]+]] = hir.send_recv %x into %[[Y]] team [1, 9] root 1 backend nccl
// CHECK-NEXT:    hir.wait %[[W1]]
// CHECK-NEXT:    %[[W2:[^ ]+]] = hir.send_recv %x into %[[Y]] team [2, 10] root 2 backend nccl
// CHECK-NEXT:    hir.wait %[[W2]]
// CHECK-NEXT:    %[[W3:[^ ]+]] = hir.send_recv %x into %[[Y]] team [3, 11] root 3 backend nccl
// CHECK-NEXT:    hir.wait %[[W3]]
// CHECK-NEXT:    %[[W4:[^ ]+]] = hir.send_recv %x into %[[Y]] team [4, 12] root 4 backend nccl
// CHECK-NEXT:    hir.wait %[[W4]]
// CHECK-NEXT:    %[[W5:[^ ]+]] = hir.send_recv %x into %[[Y]] team [5, 13] root 5 backend nccl
// CHECK-NEXT:    hir.wait %[[W5]]
// CHECK-NEXT:    %[[W6:[^ ]+]] = hir.send_recv %x into %[[Y]] team [6, 14] root 6 backend nccl
// CHECK-NEXT:    hir.wait %[[W6]]
// CHECK-NEXT:    %[[W7:[^ ]+]] = hir.send_recv %x into %[[Y]] team [7, 15] root 7 backend nccl
// CHECK-NEXT:    hir.wait %[[W7]]
// CHECK-NEXT:    func.return %[[Y]]

// didx -> replicated on the same mesh: allgather.

func.func @allgather_3(%x: !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>) -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2]> {
  %y = fusion.set %x : !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]> -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2]>
  func.return %y : !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2]>
}

// CHECK-LABEL: func.func @allgather_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allgather %x into %[[Y]] team [0, 1, 2] backend nccl
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[Y]]

// A sum over the didx axis into a replicated result: allreduce.

func.func @allreduce_3(%x: !fusion.tensor<[?, 3], f32, mesh = [0, 1, 2], axes = [_, didx]>) -> !fusion.tensor<[?], f32, mesh = [0, 1, 2]> {
  %y = fusion.sum %x [1] : !fusion.tensor<[?, 3], f32, mesh = [0, 1, 2], axes = [_, didx]> -> !fusion.tensor<[?], f32, mesh = [0, 1, 2]>
  func.return %y : !fusion.tensor<[?], f32, mesh = [0, 1, 2]>
}

// CHECK-LABEL: func.func @allreduce_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allreduce %x into %[[Y]] team [0, 1, 2] op sum backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// A max over the didx axis into a result sharded on another axis: reduce_scatter.

func.func @reduce_scatter_3(%x: !fusion.tensor<[3, 3, ?], f32, mesh = [0, 1, 2], axes = [didx, _, _]>) -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]> {
  %y = fusion.max %x [0] : !fusion.tensor<[3, 3, ?], f32, mesh = [0, 1, 2], axes = [didx, _, _]> -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>
  func.return %y : !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>
}

// CHECK-LABEL: func.func @reduce_scatter_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.reduce_scatter %x into %[[Y]] team [0, 1, 2] op max backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// One device -> sharded on a mesh: scatter from that root.

func.func @scatter_3(%x: !fusion.tensor<[3, ?], f32>) -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]> {
  %y = fusion.set %x : !fusion.tensor<[3, ?], f32> -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>
  func.return %y : !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>
}

// CHECK-LABEL: func.func @scatter_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.scatter %x into %[[Y]] team [0, 1, 2] root 0 backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// A root outside the mesh joins the team last.

func.func @scatter_outside_3(%x: !fusion.tensor<[3, ?], f32, mesh = [3]>) -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]> {
  %y = fusion.set %x : !fusion.tensor<[3, ?], f32, mesh = [3]> -> !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>
  func.return %y : !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>
}

// CHECK-LABEL: func.func @scatter_outside_3(
// CHECK:         hir.scatter %x into %{{[^ ]+}} team [0, 1, 2, 3] root 3 backend nccl

// Replicated -> sharded on the same devices: each keeps slice (device - 2).

func.func @local_slice_3(%x: !fusion.tensor<[?, 3], f32, mesh = [2, 3, 4]>) -> !fusion.tensor<[?, 3], f32, mesh = [2, 3, 4], axes = [_, didx]> {
  %y = fusion.set %x : !fusion.tensor<[?, 3], f32, mesh = [2, 3, 4]> -> !fusion.tensor<[?, 3], f32, mesh = [2, 3, 4], axes = [_, didx]>
  func.return %y : !fusion.tensor<[?, 3], f32, mesh = [2, 3, 4], axes = [_, didx]>
}

// CHECK-LABEL: func.func @local_slice_3(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[N]])
// CHECK-NEXT:    %[[DEVICE:[^ ]+]] = hir.device_index
// CHECK-NEXT:    %[[FIRST:[^ ]+]] = arith.constant 2 : index
// CHECK-NEXT:    %[[I:[^ ]+]] = arith.subi %[[DEVICE]], %[[FIRST]] : index
// CHECK-NEXT:    %[[ZERO:[^ ]+]] = arith.constant 0 : index
// CHECK-NEXT:    %[[WHOLE:[^ ]+]] = hir.alias_select %x[1 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [2, 3, 4]>
// CHECK-NEXT:    %[[SHARD:[^ ]+]] = hir.alias_select %[[Y]][1 = %[[ZERO]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [2, 3, 4]>
// CHECK-NEXT:    hir.copy ins(%[[WHOLE]] : {{.*}}) outs(%[[SHARD]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]]

// Sharded -> one device: gather to that root.

func.func @gather_3(%x: !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>) -> !fusion.tensor<[3, ?], f32, mesh = [1]> {
  %y = fusion.set %x : !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]> -> !fusion.tensor<[3, ?], f32, mesh = [1]>
  func.return %y : !fusion.tensor<[3, ?], f32, mesh = [1]>
}

// CHECK-LABEL: func.func @gather_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.gather %x into %[[Y]] team [0, 1, 2] root 1 backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// One device -> replicated on a mesh: broadcast from that root.

func.func @broadcast_3(%x: !fusion.tensor<[?, 5], f32, mesh = [2]>) -> !fusion.tensor<[?, 5], f32, mesh = [0, 1, 2]> {
  %y = fusion.set %x : !fusion.tensor<[?, 5], f32, mesh = [2]> -> !fusion.tensor<[?, 5], f32, mesh = [0, 1, 2]>
  func.return %y : !fusion.tensor<[?, 5], f32, mesh = [0, 1, 2]>
}

// CHECK-LABEL: func.func @broadcast_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.broadcast %x into %[[Y]] team [0, 1, 2] root 2 backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// A sum over the didx axis onto one device: reduce to that root.

func.func @reduce_3(%x: !fusion.tensor<[?, 3], f32, mesh = [0, 1, 2], axes = [_, didx]>) -> !fusion.tensor<[?], f32, mesh = [2]> {
  %y = fusion.sum %x [1] : !fusion.tensor<[?, 3], f32, mesh = [0, 1, 2], axes = [_, didx]> -> !fusion.tensor<[?], f32, mesh = [2]>
  func.return %y : !fusion.tensor<[?], f32, mesh = [2]>
}

// CHECK-LABEL: func.func @reduce_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.reduce %x into %[[Y]] team [0, 1, 2] root 2 op sum backend nccl
// CHECK-NEXT:    hir.wait %[[W]]

// Same layout on another mesh of the same size: one send_recv per device pair.

func.func @send_recv_3(%x: !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]>) -> !fusion.tensor<[3, ?], f32, mesh = [3, 4, 5], axes = [didx, _]> {
  %y = fusion.set %x : !fusion.tensor<[3, ?], f32, mesh = [0, 1, 2], axes = [didx, _]> -> !fusion.tensor<[3, ?], f32, mesh = [3, 4, 5], axes = [didx, _]>
  func.return %y : !fusion.tensor<[3, ?], f32, mesh = [3, 4, 5], axes = [didx, _]>
}

// CHECK-LABEL: func.func @send_recv_3(
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W0:[^ ]+]] = hir.send_recv %x into %[[Y]] team [0, 3] root 0 backend nccl
// CHECK-NEXT:    hir.wait %[[W0]]
// CHECK-NEXT:    %[[W1:[^ ]+]] = hir.send_recv %x into %[[Y]] team [1, 4] root 1 backend nccl
// CHECK-NEXT:    hir.wait %[[W1]]
// CHECK-NEXT:    %[[W2:[^ ]+]] = hir.send_recv %x into %[[Y]] team [2, 5] root 2 backend nccl
// CHECK-NEXT:    hir.wait %[[W2]]
// CHECK-NEXT:    func.return %[[Y]]

// Replicated onto some of the devices that hold it: a local copy.

func.func @copy_to_fewer_devices(%x: !fusion.tensor<[?, 4], f32, mesh = [0, 1, 2, 3]>) -> !fusion.tensor<[?, 4], f32, mesh = [1, 3]> {
  %y = fusion.set %x : !fusion.tensor<[?, 4], f32, mesh = [0, 1, 2, 3]> -> !fusion.tensor<[?, 4], f32, mesh = [1, 3]>
  func.return %y : !fusion.tensor<[?, 4], f32, mesh = [1, 3]>
}

// CHECK-LABEL: func.func @copy_to_fewer_devices(
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %x, 0
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[N]]) : !fusion.tensor<[?, 4], f32, mesh = [1, 3]>
// CHECK-NEXT:    hir.copy ins(%x : {{.*}}) outs(%[[Y]] : {{.*}})
// CHECK-NEXT:    func.return %[[Y]]

// One device to another: a send_recv.

func.func @send_recv_single_devices(%x: !fusion.tensor<[?, 4], f32, mesh = [3]>) -> !fusion.tensor<[?, 4], f32, mesh = [1]> {
  %y = fusion.set %x : !fusion.tensor<[?, 4], f32, mesh = [3]> -> !fusion.tensor<[?, 4], f32, mesh = [1]>
  func.return %y : !fusion.tensor<[?, 4], f32, mesh = [1]>
}

// CHECK-LABEL: func.func @send_recv_single_devices(
// CHECK:         %[[W:[^ ]+]] = hir.send_recv %x into %{{[^ ]+}} team [3, 1] root 3 backend nccl
// CHECK-NEXT:    hir.wait %[[W]]
