// RUN: not hir-opt %s -p 'stream-parallel{p2p_backend=ucc}' 2>&1 | filecheck %s

// CHECK: error: stream-parallel: unknown p2p_backend 'ucc'; expected one of nccl, cuda

func.func @nothing() {
  func.return
}
