// RUN: hir-opt %s -p 'fusion-to-hir{backend=cuda}' | filecheck %s
// RUN: hir-opt %s -p 'fusion-to-hir{backend=cuda}' > %t && hir-opt %t -p 'fusion-to-hir{backend=cuda}' | diff %t -

// fusion-to-hir{backend=cuda}: the copy engines move the bytes of each allgather, and
// the buffer its peers read is symmetric. A program input is copied into a symmetric
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
