fn main() {
    println!("qwen3_aot: not yet implemented");
}
