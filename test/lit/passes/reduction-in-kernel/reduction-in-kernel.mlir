// RUN: hir-opt %s --split-input-file -p reduction-in-kernel | filecheck %s
// RUN: hir-opt %s --split-input-file -p reduction-in-kernel > %t && hir-opt %s --split-input-file -p reduction-in-kernel,reduction-in-kernel | diff %t -
// RUN: hir-opt %s --split-input-file -p 'hir-lowering{reduction_in_kernel=false}' | filecheck %s --check-prefix=KEPT

// The sum of a ring's pieces (reduce-scatter-ring's last op): four slices of the staging
// buffer along the team's axis, each a view, read by one kernel that adds them in f32 in
// team order and rounds once into the output.

!staging = !fusion.tensor<[4, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!y = !fusion.tensor<[4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _]>

func.func @ring_sum(%staging: !staging, %y: !y) -> !y {
  hir.reduction "sum" [1] ins(%staging : !staging) outs(%y : !y)
  func.return %y : !y
}

// CHECK-LABEL: func.func private @ring_sum_reduction_0(
// CHECK-SAME:      %slice: !fusion.tensor<[4, ?, ?], bf16, {{.*}}>, %slice_1: {{.*}}, %slice_2: {{.*}}, %slice_3: {{.*}}) -> !fusion.tensor<[4, ?, ?], bf16, {{.*}}> {
// CHECK-NEXT:    %[[A:[^ ]+]] = fusion.cast %slice : {{.*}} -> !fusion.tensor<[4, ?, ?], f32, {{.*}}>
// CHECK-NEXT:    %[[B:[^ ]+]] = fusion.cast %slice_1
// CHECK-NEXT:    %[[C:[^ ]+]] = fusion.cast %slice_2
// CHECK-NEXT:    %[[D:[^ ]+]] = fusion.cast %slice_3
// CHECK-NEXT:    %[[AB:[^ ]+]] = fusion.add %[[A]], %[[B]]
// CHECK-NEXT:    %[[ABC:[^ ]+]] = fusion.add %[[AB]], %[[C]]
// CHECK-NEXT:    %[[ABCD:[^ ]+]] = fusion.add %[[ABC]], %[[D]]
// CHECK-NEXT:    %[[OUT:[^ ]+]] = fusion.cast %[[ABCD]] : {{.*}} -> !fusion.tensor<[4, ?, ?], bf16, {{.*}}>
// CHECK-NEXT:    func.return %[[OUT]]
// CHECK-LABEL: func.func @ring_sum(
// CHECK:         %[[S0:[^ ]+]] = hir.alias_select %staging[1 = %{{[^ ]+}}]
// CHECK-NEXT:    %[[S1:[^ ]+]] = hir.alias_select %staging[1 = %{{[^ ]+}}]
// CHECK-NEXT:    %[[S2:[^ ]+]] = hir.alias_select %staging[1 = %{{[^ ]+}}]
// CHECK-NEXT:    %[[S3:[^ ]+]] = hir.alias_select %staging[1 = %{{[^ ]+}}]
// CHECK-NEXT:    hir.launch_kernel @ring_sum_reduction_0 ins(%[[S0]], %[[S1]], %[[S2]], %[[S3]] : {{.*}}) outs(%y : {{.*}})
// CHECK-NOT:     hir.reduction
// CHECK:         func.return %y

// KEPT-LABEL: func.func @ring_sum(
// KEPT:         hir.reduction "sum" [1]

// -----

// A max keeps its type (no rounding to do); keepdim: the kernel writes slice 0 of the
// output. f32 sums add in f32 with no cast.

!x = !fusion.tensor<[3, 8], f32>
!r = !fusion.tensor<[1, 8], f32>

func.func @max_and_sum(%x: !x, %m: !r, %s: !r) -> (!r, !r) {
  hir.reduction "max" [0] keepdim ins(%x : !x) outs(%m : !r)
  hir.reduction "sum" [0] keepdim ins(%x : !x) outs(%s : !r)
  func.return %m, %s : !r, !r
}

// CHECK-LABEL: func.func private @max_and_sum_reduction_0(
// CHECK-SAME:      %slice: !fusion.tensor<[8], f32>, %slice_1: !fusion.tensor<[8], f32>, %slice_2: !fusion.tensor<[8], f32>) -> !fusion.tensor<[8], f32> {
// CHECK-NEXT:    %[[M:[^ ]+]] = fusion.maximum %slice, %slice_1
// CHECK-NEXT:    %[[MM:[^ ]+]] = fusion.maximum %[[M]], %slice_2
// CHECK-NEXT:    func.return %[[MM]]
// CHECK-LABEL: func.func private @max_and_sum_reduction_1(
// CHECK-NEXT:    %[[S:[^ ]+]] = fusion.add %slice, %slice_1
// CHECK-NEXT:    %[[SS:[^ ]+]] = fusion.add %[[S]], %slice_2
// CHECK-NEXT:    func.return %[[SS]]
// CHECK-LABEL: func.func @max_and_sum(
// CHECK:         %[[M0:[^ ]+]] = hir.alias_select %m[0 = %{{[^ ]+}}]
// CHECK-NEXT:    hir.launch_kernel @max_and_sum_reduction_0 ins({{.*}}) outs(%[[M0]] : !fusion.tensor<[8], f32>)
// CHECK:         %[[S0:[^ ]+]] = hir.alias_select %s[0 = %{{[^ ]+}}]
// CHECK-NEXT:    hir.launch_kernel @max_and_sum_reduction_1 ins({{.*}}) outs(%[[S0]] : !fusion.tensor<[8], f32>)

// -----

// Left to ATen: the last axis (a row reduction), more than eight slices, a dynamic
// extent, more than one axis, and integers.

!last = !fusion.tensor<[8, 4], f32>
!many = !fusion.tensor<[9, 8], f32>
!dyn = !fusion.tensor<[?, 8], f32>
!two = !fusion.tensor<[2, 2, 8], f32>
!ints = !fusion.tensor<[2, 8], i64>

func.func @left(%a: !last, %b: !many, %c: !dyn, %d: !two, %e: !ints, %ra: !fusion.tensor<[8], f32>, %rb: !fusion.tensor<[8], f32>, %rd: !fusion.tensor<[8], f32>, %re: !fusion.tensor<[8], i64>) {
  hir.reduction "sum" [1] ins(%a : !last) outs(%ra : !fusion.tensor<[8], f32>)
  hir.reduction "sum" [0] ins(%b : !many) outs(%rb : !fusion.tensor<[8], f32>)
  hir.reduction "sum" [0] ins(%c : !dyn) outs(%rb : !fusion.tensor<[8], f32>)
  hir.reduction "sum" [0, 1] ins(%d : !two) outs(%rd : !fusion.tensor<[8], f32>)
  hir.reduction "sum" [0] ins(%e : !ints) outs(%re : !fusion.tensor<[8], i64>)
  func.return
}

// CHECK-LABEL: func.func @left(
// CHECK-COUNT-5: hir.reduction
// CHECK-NOT:     hir.launch_kernel
