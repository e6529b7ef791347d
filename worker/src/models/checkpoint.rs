//! Per-block gradient checkpointing, as the group's transformer runs use it
//! (`torch.utils.checkpoint` around each block): a checkpointed block runs its
//! forward without keeping anything for backward, only its inputs stay alive,
//! and backward runs the block again under autodiff to get its gradients.
//!
//! Burn 0.22 has no such unit (its `BalancedCheckpointing` recomputes single
//! memory-bound ops, never a whole block) and no backward from a given output
//! gradient. So a [`Tape`] cuts the forward into pieces at block boundaries:
//! every tensor crossing a boundary becomes a leaf ([`Value`]), a block's
//! forward runs on the inner (non-autodiff) backend, and [`Tape::backward`]
//! walks the pieces in reverse, seeding each with `sum(output * grad)` (summed
//! over a block's outputs). The seed's product is one extra tensor of an
//! output's size per output, which `torch.autograd.backward(out, grad)` does
//! not allocate.
//!
//! With the tape off every call is the plain forward in one graph, exactly the
//! code without checkpointing, and `backward` is `loss.backward()`.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;

use super::amp;

/// A tensor the forward hands from one piece to the next (a block's input or
/// output). With the tape off it is just the tensor.
#[derive(Clone, Debug)]
pub struct Value {
    tensor: Tensor<3>,
    /// The leaf's index in [`Tape::leaves`] (tape on).
    leaf: Option<usize>,
}

impl Value {
    /// The tensor, for ordinary (kept) autodiff code.
    pub fn tensor(self) -> Tensor<3> {
        self.tensor
    }
}

type Rerun<'a> = Box<dyn Fn(Vec<Tensor<3>>) -> Vec<Tensor<3>> + 'a>;

enum Piece<'a> {
    /// Ordinary autodiff code between blocks, its graph kept until backward:
    /// the tracked tensors it handed on, each with the leaf standing for it.
    Kept(Vec<(Tensor<3>, usize)>),
    /// A checkpointed block: its input leaves, its output leaves, and how to run it again.
    Block { inputs: Vec<usize>, outputs: Vec<usize>, rerun: Rerun<'a> },
}

/// The forward's record for per-block checkpointing (see the module docs).
pub struct Tape<'a> {
    on: bool,
    /// Every boundary tensor as a leaf; dropped once backward is past its producer.
    leaves: Vec<Option<Tensor<3>>>,
    pieces: Vec<Piece<'a>>,
}

impl<'a> Tape<'a> {
    pub fn new(on: bool) -> Self {
        Tape { on, leaves: Vec::new(), pieces: Vec::new() }
    }

    /// Hand `t` on to later pieces. With the tape on, its graph ends here and
    /// a leaf stands for it from now on.
    pub fn value(&mut self, t: Tensor<3>) -> Value {
        if !self.on {
            return Value { tensor: t, leaf: None };
        }
        let id = self.leaves.len();
        let leaf = t.clone().detach().require_grad();
        match self.pieces.last_mut() {
            Some(Piece::Kept(outputs)) => outputs.push((t, id)),
            _ => self.pieces.push(Piece::Kept(vec![(t, id)])),
        }
        self.leaves.push(Some(leaf.clone()));
        Value { tensor: leaf, leaf: Some(id) }
    }

    /// Run `block` on `inputs` through `f`. With the tape on, nothing of the
    /// block's forward is kept: it runs without autodiff, and again with it in
    /// [`Tape::backward`].
    pub fn block<M, F, const N: usize>(&mut self, block: &'a M, inputs: [Value; N], f: F) -> Value
    where
        M: Module,
        F: Fn(&M, [Tensor<3>; N]) -> Tensor<3> + 'a,
    {
        let run = move |m: &M, x: Vec<Tensor<3>>| {
            vec![f(m, x.try_into().unwrap_or_else(|_| unreachable!("a block runs with its own inputs")))]
        };
        let mut out = self.blocks(block, inputs.into(), run);
        out.pop().expect("one output")
    }

    /// [`Tape::block`] for a block of several inputs and outputs (a UNet
    /// level: its input and the time embedding in, every skip it makes out).
    pub fn blocks<M, F>(&mut self, block: &'a M, inputs: Vec<Value>, f: F) -> Vec<Value>
    where
        M: Module,
        F: Fn(&M, Vec<Tensor<3>>) -> Vec<Tensor<3>> + 'a,
    {
        if !self.on {
            let out = f(block, inputs.into_iter().map(Value::tensor).collect());
            return out.into_iter().map(|tensor| Value { tensor, leaf: None }).collect();
        }
        let ids: Vec<usize> = inputs.iter().map(|v| self.leaf_of(v)).collect();
        let plain = inputs.into_iter().map(|v| v.tensor.without_autodiff()).collect();
        let mut outputs = Vec::new();
        let mut values = Vec::new();
        for t in f(&block.valid(), plain) {
            let tensor = t.autodiff().require_grad();
            outputs.push(self.leaves.len());
            self.leaves.push(Some(tensor.clone()));
            values.push(Value { tensor, leaf: outputs.last().copied() });
        }
        let rerun: Rerun<'a> = Box::new(move |x: Vec<Tensor<3>>| f(block, x));
        self.pieces.push(Piece::Block { inputs: ids, outputs, rerun });
        values
    }

    fn leaf_of(&mut self, v: &Value) -> usize {
        match v.leaf {
            Some(id) => id,
            // A tensor that did not come through this tape (cannot happen with
            // `value` at every boundary; handled anyway by cutting it here).
            None => self.value(v.tensor.clone()).leaf.expect("tape on"),
        }
    }

    /// Backward from `loss`: the model's parameter gradients, as
    /// `GradientsParams::from_grads(loss.backward(), model)` gives without checkpointing.
    pub fn backward<M: Module>(self, loss: Tensor<1>, model: &M) -> GradientsParams {
        if !self.on {
            return GradientsParams::from_grads(loss.backward(), model);
        }
        let Tape { mut leaves, pieces, .. } = self;
        let mut seeds: Vec<Option<Tensor<3>>> = vec![None; leaves.len()];
        let mut params = GradientsParams::new();
        let mut grads = loss.backward();
        collect(&mut grads, &leaves, &mut seeds, &mut params, model);
        for piece in pieces.into_iter().rev() {
            match piece {
                Piece::Kept(outputs) => {
                    let seeded = outputs
                        .into_iter()
                        .filter_map(|(t, id)| {
                            leaves[id] = None;
                            seeds[id].take().map(|g| amp::mul(t, g).sum())
                        })
                        .reduce(amp::add);
                    if let Some(s) = seeded {
                        let mut grads = s.backward();
                        collect(&mut grads, &leaves, &mut seeds, &mut params, model);
                    }
                }
                Piece::Block { inputs, outputs, rerun } => {
                    let g: Vec<Option<Tensor<3>>> = outputs
                        .iter()
                        .map(|&o| {
                            leaves[o] = None;
                            seeds[o].take()
                        })
                        .collect();
                    if g.iter().all(Option::is_none) {
                        continue;
                    }
                    let x: Vec<Tensor<3>> = inputs
                        .iter()
                        .map(|&i| leaves[i].clone().expect("an input outlives its consumers").detach().require_grad())
                        .collect();
                    let out = rerun(x.clone());
                    let Some(seeded) =
                        out.into_iter().zip(g).filter_map(|(o, g)| g.map(|g| amp::mul(o, g).sum())).reduce(amp::add)
                    else {
                        continue;
                    };
                    let mut grads = seeded.backward();
                    for (x, &i) in x.iter().zip(&inputs) {
                        if let Some(d) = x.grad_remove(&mut grads) {
                            accumulate(&mut seeds[i], d);
                        }
                    }
                    merge(&mut params, GradientsParams::from_module(&mut grads, model), model);
                }
            }
        }
        params
    }
}

/// Take from `grads` the gradients of every live leaf (into `seeds`) and of the
/// model's parameters (into `params`).
fn collect<M: Module>(
    grads: &mut burn::tensor::Gradients,
    leaves: &[Option<Tensor<3>>],
    seeds: &mut [Option<Tensor<3>>],
    params: &mut GradientsParams,
    model: &M,
) {
    for (leaf, seed) in leaves.iter().zip(seeds.iter_mut()) {
        if let Some(d) = leaf.as_ref().and_then(|l| l.grad_remove(grads)) {
            accumulate(seed, d);
        }
    }
    merge(params, GradientsParams::from_module(grads, model), model);
}

fn accumulate(slot: &mut Option<Tensor<3>>, d: Tensor<3>) {
    *slot = Some(match slot.take() {
        Some(s) => amp::add(s, d),
        None => d,
    });
}

/// Add `from` into `into`, parameter by parameter.
fn merge<M: Module>(into: &mut GradientsParams, from: GradientsParams, model: &M) {
    struct Merge<'g> {
        from: GradientsParams,
        into: &'g mut GradientsParams,
    }
    impl ModuleVisitor for Merge<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.from.remove::<D>(param.id) {
                let sum = match self.into.remove::<D>(param.id) {
                    Some(old) => old + g,
                    None => g,
                };
                self.into.register(param.id, sum);
            }
        }
    }
    if !from.is_empty() {
        model.visit(&mut Merge { from, into });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_util::device;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Distribution;

    #[derive(Module, Debug)]
    struct Net {
        input: Linear,
        blocks: Vec<Linear>,
        head: Linear,
    }

    impl Net {
        fn new(device: &Device) -> Self {
            Net {
                input: LinearConfig::new(4, 8).init(device),
                blocks: (0..3).map(|_| LinearConfig::new(8, 8).init(device)).collect(),
                head: LinearConfig::new(8, 2).init(device),
            }
        }

        /// A residual stack with a skip from the first block into the head and
        /// a conditioning tensor every block reads, as the transformer families have.
        fn forward<'a>(&'a self, x: Tensor<3>, tape: &mut Tape<'a>) -> Tensor<1> {
            let h = self.input.forward(x);
            let c = tape.value(h.clone().tanh());
            let mut h = tape.value(h);
            let mut skip = None;
            for b in &self.blocks {
                h = tape.block(b, [h, c.clone()], |b, [h, c]| h.clone() + b.forward(h).tanh() * c);
                skip.get_or_insert_with(|| h.clone());
            }
            let out = self.head.forward(h.tensor() + skip.expect("three blocks").tensor());
            out.square().mean()
        }
    }

    fn grads(net: &Net, x: &Tensor<3>, on: bool) -> (f32, Vec<Vec<f32>>) {
        let mut tape = Tape::new(on);
        let loss = net.forward(x.clone(), &mut tape);
        let value = loss.clone().into_data().iter::<f32>().next().expect("one value");
        let g = tape.backward(loss, net);
        let mut all = Vec::new();
        struct Get<'g>(&'g GradientsParams, &'g mut Vec<Vec<f32>>);
        impl ModuleVisitor for Get<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                let g = self.0.get::<D>(p.id).expect("every parameter has a gradient");
                self.1.push(g.into_data().try_to_vec::<f32>().unwrap());
            }
        }
        net.visit(&mut Get(&g, &mut all));
        (value, all)
    }

    #[test]
    fn checkpointed_blocks_give_the_same_gradients() {
        let device = device().autodiff();
        let net = Net::new(&device);
        let x = Tensor::<3>::random([2, 5, 4], Distribution::Normal(0.0, 1.0), &device);
        let (plain_loss, plain) = grads(&net, &x, false);
        let (ckpt_loss, ckpt) = grads(&net, &x, true);
        assert!((plain_loss - ckpt_loss).abs() <= 1e-6 * plain_loss.abs(), "{plain_loss} vs {ckpt_loss}");
        assert_eq!(plain.len(), 2 * 5, "weights and biases of 5 linears");
        for (a, b) in plain.iter().zip(&ckpt) {
            for (u, v) in a.iter().zip(b) {
                assert!((u - v).abs() <= 1e-5 * (1.0 + u.abs()), "{u} vs {v}");
            }
            assert!(a.iter().any(|u| *u != 0.0));
        }
    }
}
