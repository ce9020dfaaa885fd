// A pipeline pass runs as its passes: --print-ir-after-all and --time-passes name each
// pass of hir-lowering, as mlir-opt does for the passes of a pipeline. --time-passes
// writes to stderr, so its output still pipes into another hir-opt, and `-` is stdin
// for the input and stdout for -o.
// RUN: hir-opt %s -p 'hir-lowering{per-stream-buffers=false}' --print-ir-after-all 2>&1 >/dev/null | filecheck %s --check-prefix=AFTER
// RUN: hir-opt %s -p hir-lowering --time-passes 2>%t.time | hir-opt - -o - -p cse | filecheck %s --check-prefix=PIPE
// RUN: filecheck %s --input-file=%t.time --check-prefix=TIME

// AFTER: // -----// IR Dump After insert-reshardings //----- //
// AFTER: fusion.set
// AFTER: // -----// IR Dump After fusion-to-hir //----- //
// AFTER: hir.allgather
// AFTER: // -----// IR Dump After stream-parallel //----- //
// AFTER: scf.for
// AFTER: // -----// IR Dump After reduce-scatter-in-matmul //----- //
// AFTER: // -----// IR Dump After copy-engine-pipelining //----- //
// AFTER-NOT: IR Dump After per-stream-buffers
// AFTER: // -----// IR Dump After insert-deallocations //----- //
// AFTER: // -----// IR Dump After forward-buffers //----- //
// AFTER: // -----// IR Dump After buffer-layouts //----- //
// AFTER: // -----// IR Dump After canonicalize //----- //
// AFTER: // -----// IR Dump After cse //----- //
// AFTER-NOT: IR Dump

// PIPE: func.func @ag_matmul
// PIPE: scf.for
// PIPE: hir.matmul

// TIME: {{^}}Pass insert-reshardings took {{[0-9.]+}} seconds
// TIME-NEXT: {{^}}Pass fusion-to-hir took
// TIME-NEXT: {{^}}Pass stream-parallel took
// TIME: {{^}}Pass reduce-scatter-in-matmul took
// TIME: {{^}}Pass copy-engine-pipelining took
// TIME: {{^}}Pass per-stream-buffers took
// TIME: {{^}}Pass insert-deallocations took
// TIME-NEXT: {{^}}Pass forward-buffers took
// TIME-NEXT: {{^}}Pass buffer-layouts took
// TIME-NEXT: {{^}}Pass canonicalize took
// TIME-NEXT: {{^}}Pass cse took
// TIME-EMPTY:

!a = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [_, didx, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1]>
!c = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _, _]>

func.func @ag_matmul(%a: !a, %b: !b) -> !c {
  %c = fusion.matmul %a, %b : (!a, !b) -> !c
  func.return %c : !c
}
