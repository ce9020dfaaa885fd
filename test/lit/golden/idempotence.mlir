// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p hir-lowering > %t.p2p
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p hir-lowering,hir-lowering | diff %t.p2p -
// RUN: hir-opt %S/../../../examples/matmul_rs_through_bcast.mlir -p hir-lowering > %t.rs
// RUN: hir-opt %S/../../../examples/matmul_rs_through_bcast.mlir -p hir-lowering,hir-lowering | diff %t.rs -

// Lowering a lowered program changes nothing. (Each pass alone is checked the same way
// in test/lit/passes/<pass>/.)
