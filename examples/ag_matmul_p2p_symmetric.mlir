// ag_matmul_p2p with A passed in symmetric memory ({hir.symmetric}, docs/copy-engine.md):
// lowered with the copy engines (hir-lowering{p2p_backend=cuda}), the peers read A where
// it is, with no copy of it into symmetric memory first. hir-run places A there itself.

!a = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>
!out = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>

func.func @ag_matmul_p2p_symmetric(%a: !a {hir.symmetric}, %b: !b) -> !out {
  %out = fusion.matmul %a, %b : (!a, !b) -> !out
  func.return %out : !out
}
