// hir-opt knows every dialect and pass of xDSL's universe next to hostir's: memref
// parses, xDSL's licm and convert-scf-to-cf run. And xDSL's own xdsl-opt and xdsl-run
// know hostir's dialects and passes, through the `xdsl.universe` entry point that
// `pip install` registers (xdsl-run reads a module that holds a fusion).
// RUN: hir-opt %s -p licm | filecheck %s --check-prefix=LICM
// RUN: hir-opt %s -p convert-scf-to-cf | filecheck %s --check-prefix=CF
// RUN: %python -m xdsl.tools.xdsl_opt %s -p insert-reshardings,fusion-to-hir | filecheck %s --check-prefix=XDSL-OPT
// RUN: %python -m xdsl.tools.xdsl_run %S/Inputs/xdsl-run.mlir --verbose | filecheck %s --check-prefix=RAN

// LICM: func.func @loop
// LICM: %next = arith.addi %n, %c1 : index
// LICM-NEXT: %r = scf.for
// LICM-NEXT: %v = memref.load %m[%c0] : memref<4xindex>

// CF: func.func @loop
// CF-NOT: scf.for
// CF: cf.cond_br

// RAN: result: 3

// XDSL-OPT: func.func @loop
// XDSL-OPT: func.func @neg
// XDSL-OPT: %y = hir.allocate() : !fusion.tensor<[4], f32>
// XDSL-OPT: hir.launch_kernel

func.func @loop(%m: memref<4xindex>, %n: index) -> index {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %c0) -> (index) {
    %next = arith.addi %n, %c1 : index
    %v = memref.load %m[%c0] : memref<4xindex>
    %s = arith.addi %v, %next : index
    scf.yield %s : index
  }
  func.return %r : index
}

func.func @neg(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return %y : !fusion.tensor<[4], f32>
}
