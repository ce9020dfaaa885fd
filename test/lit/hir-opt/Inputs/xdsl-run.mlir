func.func @main() -> index {
  %c = arith.constant 3 : index
  func.return %c : index
}

func.func @neg(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return %y : !fusion.tensor<[4], f32>
}
