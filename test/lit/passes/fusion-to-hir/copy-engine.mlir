// RUN: hir-opt %s -p 'fusion-to-hir{backend=cuda}' | filecheck %s
// RUN: hir-opt %s -p 'fusion-to-hir{backend=cuda}' > %t && hir-opt %t -p 'fusion-to-hir{backend=cuda}' | diff %t -

// fusion-to-hir{backend=cuda}: the copy engines move the bytes of each allgather,
// allreduce and reduce_scatter, and the buffer its peers read is symmetric. A program input is copied into a symmetric
// buffer first; a buffer the program computes and does not return is allocated
// symmetric in place; one it returns is copied, since the next run reuses a symmetric
// buffer.

!shard = !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _]>
!full = !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3]>

func.func @input(%x: !shard) -> !full {
  %y = fusion.set %x : !shard -> !full
  func.return %y : !full
}

// CHECK-LABEL: func.func @input(
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %x, 1
// CHECK-NEXT:    %[[X:[^ ]+]] = hir.allocate(%[[M]]) symmetric : !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _]>
// CHECK-NEXT:    hir.copy ins(%x : {{.*}}) outs(%[[X]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[M]]) : !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3]>
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allgather %[[X]] into %[[Y]] team [0, 1, 2, 3] backend cuda
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[Y]]

// An input the caller passes in symmetric memory (`hir.symmetric`) is read in place.

func.func @symmetric_input(%x: !shard {hir.symmetric}) -> !full {
  %y = fusion.set %x : !shard -> !full
  func.return %y : !full
}

// CHECK-LABEL: func.func @symmetric_input(
// CHECK-SAME:      %x: !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _]> {hir.symmetric}
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %x, 1
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[M]]) : !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3]>
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allgather %x into %[[Y]] team [0, 1, 2, 3] backend cuda
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[Y]]

func.func @computed(%x: !shard) -> !full {
  %n = fusion.neg %x : !shard -> !shard
  %y = fusion.set %n : !shard -> !full
  func.return %y : !full
}

// CHECK-LABEL: func.func @computed(
// CHECK:         %[[N:[^ ]+]] = hir.allocate(%{{.*}}) symmetric : !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _]>
// CHECK-NEXT:    hir.launch_kernel @computed_segment_0 ins(%x : {{.*}}) outs(%[[N]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allgather %[[N]] into %[[Y]] team [0, 1, 2, 3] backend cuda
// CHECK-NOT:     hir.copy

func.func @returned(%x: !shard) -> (!shard, !full) {
  %n = fusion.neg %x : !shard -> !shard
  %y = fusion.set %n : !shard -> !full
  func.return %n, %y : !shard, !full
}

// CHECK-LABEL: func.func @returned(
// CHECK:         %[[N:[^ ]+]] = hir.allocate(%{{.*}}) : !fusion.tensor<[4, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _]>
// CHECK-NEXT:    hir.launch_kernel @returned_segment_0 ins(%x : {{.*}}) outs(%[[N]] :
// CHECK-NEXT:    hir.dim %[[N]], 1
// CHECK-NEXT:    %[[S:[^ ]+]] = hir.allocate(%{{.*}}) symmetric
// CHECK-NEXT:    hir.copy ins(%[[N]] : {{.*}}) outs(%[[S]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allgather %[[S]] into %[[Y]] team [0, 1, 2, 3] backend cuda
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[N]], %[[Y]]

// The reductions pull too: each device reads its peers' partials (the whole of each
// for an allreduce, the piece it owns for a reduce_scatter) and reduces them locally,
// so the input of hir.allreduce and hir.reduce_scatter becomes peer-readable the same
// way: a program input is copied, partial sums computed and not returned are
// symmetric in place, returned ones are copied.

!partials = !fusion.tensor<[2, 2, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
!scattered = !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>
!rows = !fusion.tensor<[2, ?], f32, mesh = [0, 1]>
!k_shard = !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
!summed = !fusion.tensor<[?, ?], f32, mesh = [0, 1]>

func.func @reduce_scatter_input(%x: !partials) -> !scattered {
  %y = fusion.sum %x [0] : !partials -> !scattered
  func.return %y : !scattered
}

// CHECK-LABEL: func.func @reduce_scatter_input(
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %x, 2
// CHECK-NEXT:    %[[X:[^ ]+]] = hir.allocate(%[[M]]) symmetric : !fusion.tensor<[2, 2, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    hir.copy ins(%x : {{.*}}) outs(%[[X]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[M]]) : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.reduce_scatter %[[X]] into %[[Y]] team [0, 1] op sum backend cuda
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[Y]]

func.func @allreduce_input(%x: !partials) -> !rows {
  %y = fusion.max %x [0] : !partials -> !rows
  func.return %y : !rows
}

// CHECK-LABEL: func.func @allreduce_input(
// CHECK-NEXT:    %[[M:[^ ]+]] = hir.dim %x, 2
// CHECK-NEXT:    %[[X:[^ ]+]] = hir.allocate(%[[M]]) symmetric : !fusion.tensor<[2, 2, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    hir.copy ins(%x : {{.*}}) outs(%[[X]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate(%[[M]]) : !fusion.tensor<[2, ?], f32, mesh = [0, 1]>
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allreduce %[[X]] into %[[Y]] team [0, 1] op max backend cuda
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[Y]]

func.func @partial_sums(%a: !k_shard, %b: !k_shard) -> !summed {
  %p = fusion.matmul %a, %b : (!k_shard, !k_shard) -> !k_shard
  %y = fusion.sum %p [0] : !k_shard -> !summed
  func.return %y : !summed
}

// CHECK-LABEL: func.func @partial_sums(
// CHECK:         %[[P:[^ ]+]] = hir.allocate(%{{.*}}) symmetric : !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    hir.matmul ins(%a, %b : {{.*}}) outs(%[[P]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allreduce %[[P]] into %[[Y]] team [0, 1] op sum backend cuda
// CHECK-NOT:     hir.copy

func.func @returned_partial_sums(%a: !k_shard, %b: !k_shard) -> (!k_shard, !summed) {
  %p = fusion.matmul %a, %b : (!k_shard, !k_shard) -> !k_shard
  %y = fusion.sum %p [0] : !k_shard -> !summed
  func.return %p, %y : !k_shard, !summed
}

// CHECK-LABEL: func.func @returned_partial_sums(
// CHECK:         %[[P:[^ ]+]] = hir.allocate(%{{.*}}) : !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    hir.matmul ins(%a, %b : {{.*}}) outs(%[[P]] :
// CHECK:         %[[S:[^ ]+]] = hir.allocate(%{{.*}}) symmetric
// CHECK-NEXT:    hir.copy ins(%[[P]] : {{.*}}) outs(%[[S]] :
// CHECK-NEXT:    %[[Y:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[W:[^ ]+]] = hir.allreduce %[[S]] into %[[Y]] team [0, 1] op sum backend cuda
// CHECK-NEXT:    hir.wait %[[W]]
// CHECK-NEXT:    func.return %[[P]], %[[Y]]
