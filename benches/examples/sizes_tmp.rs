use swarm_core::fabric::*;
use swarm_core::*;
fn main() {
    println!("Op {}", std::mem::size_of::<Op>());
    println!("Batch {}", std::mem::size_of::<Batch>());
    println!("OpOutput {}", std::mem::size_of::<OpOutput>());
    println!("Completion {}", std::mem::size_of::<Completion>());
    println!("FabricError {}", std::mem::size_of::<FabricError>());
    println!(
        "Result<Completion> {}",
        std::mem::size_of::<Result<Completion, FabricError>>()
    );
    println!("Submitted {}", std::mem::size_of::<Submitted>());
    println!(
        "Roundtrip {}",
        std::mem::size_of::<Roundtrip<'static, swarm_shm::ShmFabric>>()
    );
}
