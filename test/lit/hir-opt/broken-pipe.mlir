// Writing into a pipe that the reader has closed (`hir-opt --list-passes | head -1`)
// ends hir-opt quietly, with status 141 (128 + SIGPIPE) as other command-line tools:
// no BrokenPipeError traceback, nothing on stderr.
// RUN: %python %S/Inputs/closed_pipe.py hir-opt --list-passes | filecheck %s
// RUN: %python %S/Inputs/closed_pipe.py hir-opt --help | filecheck %s
// RUN: %python %S/Inputs/closed_pipe.py hir-opt %s -p hir-lowering | filecheck %s
// RUN: %python %S/Inputs/closed_pipe.py hir-opt %s --split-input-file --print-between-passes -p cse,dce | filecheck %s

// CHECK: status 141
// CHECK-NEXT: stderr []

func.func @f(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return %y : !fusion.tensor<[4], f32>
}
