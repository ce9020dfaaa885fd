// Every hir op that fusion-to-hir makes carries the location of the fusion op it lowers,
// so that a runtime error points at the user's line.
// RUN: hir-opt %s -p fusion-to-hir --print-debuginfo | filecheck %s

func.func @f(%x: !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, 8], f32, mesh = [0, 1]> {
  %y = fusion.set %x : !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
  %z = fusion.exp %y : !fusion.tensor<[2, 8], f32, mesh = [0, 1]> -> !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
  func.return %z : !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
}

// CHECK:      func.func @f(
// CHECK-NEXT:   hir.allocate() {{.*}} loc("{{.*}}locations.mlir":6:3)
// CHECK-NEXT:   hir.allgather {{.*}} loc("{{.*}}locations.mlir":6:3)
// CHECK-NEXT:   hir.wait {{.*}} loc("{{.*}}locations.mlir":6:3)
// CHECK-NEXT:   hir.allocate() {{.*}} loc("{{.*}}locations.mlir":7:3)
// CHECK-NEXT:   hir.launch_kernel @f_segment_0 {{.*}} loc("{{.*}}locations.mlir":7:3)
