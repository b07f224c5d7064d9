//! Live memory grouped by the user's call sites, with the phase each site's
//! frames suggest and the role its blocks became.

use crate::frames::{is_framework, is_python, Classifier, Phase, Role, Site, StackInfo};
use crate::roles::Lifetimes;
use crate::walk::Live;
use headroom_trace::snapshot::{StackId, Stacks};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// Call sites numbered in the order they are first met.
#[derive(Clone)]
pub struct Sites<'a> {
    classifier: Classifier<'a>,
    stacks: &'a Stacks,
    pub list: Vec<StackInfo>,
    /// By site: the first stack met that collapses into it (0 for none), to show in full.
    first_stack: Vec<StackId>,
    by_stack: Vec<u32>,
    by_name: FxHashMap<String, u32>,
}

/// One call site as the HTML report shows it when pointed at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteDetail {
    pub site: String,
    pub role: Role,
    pub phase: Phase,
    /// The user's own frames of one of its stacks (Python frames outside torch and the
    /// standard library), innermost first, as `file:line in function`: what the report
    /// shows first. The stack's first [`STACK_SHOWN`] frames where it has none of the
    /// user's (the autograd engine's thread).
    pub frames: Vec<String>,
    /// That stack whole, innermost first, at most [`STACK_WHOLE`] frames: shown on request.
    pub stack: Vec<String>,
    /// Frames of that stack beyond [`STACK_WHOLE`].
    pub more_frames: usize,
}

/// Frames shown of a stack without the user's own.
pub const STACK_SHOWN: usize = 40;

/// Frames kept of a whole stack: allocator internals, CPython's and C++ frames
/// come before the user's, and a recorded stack holds about a hundred.
pub const STACK_WHOLE: usize = 200;

const UNSEEN: u32 = u32::MAX;

impl<'a> Sites<'a> {
    pub fn new(stacks: &'a Stacks, cpp: bool) -> Sites<'a> {
        Sites {
            classifier: Classifier::new(stacks, cpp),
            stacks,
            list: Vec::new(),
            first_stack: Vec::new(),
            by_stack: vec![UNSEEN; stacks.stacks.len()],
            by_name: FxHashMap::default(),
        }
    }

    /// The site of an allocation: by its stack, or "live when the trace
    /// began" for a block allocated before the trace whose stack is unknown.
    pub fn of(&mut self, live: &Live) -> u32 {
        if live.since.is_none() && live.stack == 0 {
            return self.named(StackInfo {
                site: Site { site: "(live when the trace began)".into(), file: None, line: None, function: None },
                phase: Phase::Unknown,
                role: Role::BeforeTrace,
            });
        }
        self.of_stack(live.stack)
    }

    pub fn of_stack(&mut self, stack: StackId) -> u32 {
        let i = stack as usize;
        if i >= self.by_stack.len() {
            self.by_stack.resize(i + 1, UNSEEN);
        }
        if self.by_stack[i] == UNSEEN {
            let info = self.classifier.info(stack).clone();
            let id = self.named(info);
            if self.first_stack[id as usize] == 0 {
                self.first_stack[id as usize] = stack;
            }
            self.by_stack[i] = id;
        }
        self.by_stack[i]
    }

    /// What the report shows of site `id` when it is pointed at.
    pub fn detail(&self, id: u32) -> SiteDetail {
        let info = &self.list[id as usize];
        let stack = self.first_stack[id as usize];
        let all = self.stacks.stacks.get(stack as usize).map_or(0, |s| s.len());
        let line = |(file, line, name): (&str, i64, &str)| {
            crate::printable::printable(&format!("{file}:{line} in {name}")).into_owned()
        };
        let user = |&(file, _, _): &(&str, i64, &str)| is_python(file) && !is_framework(file);
        let mut frames: Vec<String> = self.stacks.frames_of(stack).filter(user).map(line).collect();
        if frames.is_empty() {
            // The allocator's own frames (and the unwinder's that recorded them) come first and
            // say nothing of the caller: shown from the frame that called the allocator.
            let inner = self.stacks.frames_of(stack).take(STACK_SHOWN);
            let past = inner.enumerate().filter(|(_, (_, _, n))| n.contains("CUDACachingAllocator")).last();
            let skip = past.map_or(0, |(i, _)| i + 1);
            frames = self.stacks.frames_of(stack).skip(skip).take(STACK_SHOWN).map(line).collect();
        }
        SiteDetail {
            site: info.site.site.clone(),
            role: info.role,
            phase: info.phase,
            frames,
            stack: self.stacks.frames_of(stack).take(STACK_WHOLE).map(line).collect(),
            more_frames: all.saturating_sub(STACK_WHOLE),
        }
    }

    /// What the stack says.
    pub fn info(&mut self, stack: StackId) -> &StackInfo {
        let id = self.of_stack(stack);
        &self.list[id as usize]
    }

    fn named(&mut self, mut info: StackInfo) -> u32 {
        // Every site shown (text, HTML, JSON, traces) passes here: names from the file made safe once.
        if let std::borrow::Cow::Owned(safe) = crate::printable::printable(&info.site.site) {
            info.site.site = safe;
        }
        if let Some(&id) = self.by_name.get(&info.site.site) {
            return id;
        }
        let id = self.list.len() as u32;
        self.by_name.insert(info.site.site.clone(), id);
        self.list.push(info);
        self.first_stack.push(0);
        id
    }
}

/// One call site's live memory at a moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteBytes {
    #[serde(flatten)]
    pub site: Site,
    /// Block bytes (as allocated counts them).
    pub bytes: u64,
    pub blocks: usize,
    pub role: Role,
    pub phase: Phase,
    #[serde(skip)]
    pub id: u32,
}

/// Live memory of one role at a moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleBytes {
    pub role: Role,
    pub bytes: u64,
    pub blocks: usize,
    /// How the role was inferred.
    pub how: &'static str,
}

/// The live allocations grouped by site, largest first, and by role: each
/// block's role is what it became where `lifetimes` tell, else what its
/// frames suggest, and a site's is the role of most of its bytes.
/// Blocks freed by the caller but still pending are not the caller's: left out.
pub fn group<'l>(
    live: impl Iterator<Item = &'l Live>,
    sites: &mut Sites,
    lifetimes: Option<&Lifetimes>,
) -> (Vec<SiteBytes>, Vec<RoleBytes>) {
    let mut by_site: FxHashMap<u32, (u64, usize)> = FxHashMap::default();
    let mut roles: FxHashMap<Role, (u64, usize)> = FxHashMap::default();
    let mut site_roles: FxHashMap<(u32, Role), u64> = FxHashMap::default();
    for l in live.filter(|l| !l.pending) {
        let id = sites.of(l);
        let info = &sites.list[id as usize];
        let role = lifetimes.map_or(info.role, |t| t.role(l, info));
        for e in [by_site.entry(id).or_default(), roles.entry(role).or_default()] {
            e.0 += l.size;
            e.1 += 1;
        }
        *site_roles.entry((id, role)).or_default() += l.size;
    }
    let mut out: Vec<SiteBytes> = by_site
        .into_iter()
        .map(|(id, (bytes, blocks))| {
            let info = &sites.list[id as usize];
            let role = site_roles
                .iter()
                .filter(|((s, _), _)| *s == id)
                .max_by(|((_, ra), a), ((_, rb), b)| a.cmp(b).then(rb.cmp(ra)))
                .map_or(info.role, |((_, r), _)| *r);
            SiteBytes { site: info.site.clone(), bytes, blocks, role, phase: info.phase, id }
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.site.cmp(&b.site.site)));
    let mut roles: Vec<RoleBytes> =
        roles.into_iter().map(|(role, (bytes, blocks))| RoleBytes { role, bytes, blocks, how: role.how() }).collect();
    roles.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.role.cmp(&b.role)));
    (out, roles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::one_stack as stacks;

    /// The user's frames first; without any (the autograd engine's thread), the stack from
    /// the frame that called the allocator; the whole stack kept for the asking.
    #[test]
    fn a_site_shows_the_users_frames_first() {
        let lib = "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so";
        let s = stacks(&[
            ("/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so", 1, "torch::unwind::unwind()"),
            (lib, 2, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long)"),
            ("/usr/bin/python3.12", 3, "_PyEval_EvalFrameDefault"),
            ("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 109, "__init__"),
            ("/home/me/model.py", 77, "__init__"),
            ("/home/me/train.py", 69, "build"),
        ]);
        let mut sites = Sites::new(&s, false);
        let id = sites.of_stack(1);
        let d = sites.detail(id);
        assert_eq!(d.frames, ["/home/me/model.py:77 in __init__", "/home/me/train.py:69 in build"]);
        assert_eq!(d.stack.len(), 6);
        let s = stacks(&[
            ("/venv/lib/python3.12/site-packages/torch/lib/libtorch_cpu.so", 1, "torch::unwind::unwind()"),
            (lib, 2, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
            ("libtorch_cpu.so", 3, "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
            ("libtorch_cpu.so", 4, "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
        ]);
        let mut sites = Sites::new(&s, false);
        let id = sites.of_stack(1);
        let d = sites.detail(id);
        assert_eq!(d.site, "autograd MmBackward0");
        assert!(d.frames[0].ends_with("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"), "{:?}", d.frames);
        assert_eq!(d.stack.len(), 4);
    }
}
