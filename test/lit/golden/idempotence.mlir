// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p hir-lowering > %t.p2p
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p hir-lowering,hir-lowering | diff %t.p2p -
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p 'hir-lowering{p2p_order=device}' > %t.device
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p 'hir-lowering{p2p_order=device},hir-lowering{p2p_order=device}' | diff %t.device -
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p 'hir-lowering{p2p_backend=cuda}' > %t.cuda
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p.mlir -p 'hir-lowering{p2p_backend=cuda},hir-lowering{p2p_backend=cuda}' | diff %t.cuda -
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p_symmetric.mlir -p 'hir-lowering{p2p_backend=cuda}' > %t.symmetric
// RUN: hir-opt %S/../../../examples/ag_matmul_p2p_symmetric.mlir -p 'hir-lowering{p2p_backend=cuda},hir-lowering{p2p_backend=cuda}' | diff %t.symmetric -
// RUN: hir-opt %S/../../../examples/matmul_rs_through_bcast.mlir -p hir-lowering > %t.rs
// RUN: hir-opt %S/../../../examples/matmul_rs_through_bcast.mlir -p hir-lowering,hir-lowering | diff %t.rs -

// Lowering a lowered program changes nothing, with the point-to-point allgather in ring
// order (the default), in pr4515's device order and on the copy engines (also with its
// input in symmetric memory). (Each pass alone is checked the same way in
// test/lit/passes/<pass>/.)
