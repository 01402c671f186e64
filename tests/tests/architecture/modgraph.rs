//! The module graph of one crate, read from its sources as text: which
//! module names which other module of the same crate.
//!
//! A module is a file module (`mod x;`, `#[path]` honoured) or an inline
//! one (`mod tests { .. }`). A reference is every `use` leaf (grouped
//! imports `use a::{b, c::{d, self}}` give one leaf each) and every path in
//! the code that starts with `crate::`, `super::`, `self::`, a child
//! module's name or a name a `use` brought in. A reference resolves to the
//! deepest module it names; a name a module re-exports (`pub use x::Y`, or
//! a private `use` its children see) resolves to where it comes from, so
//! `crate::Error` re-exported from `error.rs` points at `error`, not at the
//! crate root. Comments, strings and `$crate` paths are not references;
//! `pub(in crate::x)` is a visibility, not a reference.
//!
//! An edge joins two modules when one names the other, except a module
//! naming one it is declared in (`crate::Error` defined in lib.rs, a test
//! module's `use super::*`): a module sits inside its ancestors and sees
//! their items as its enclosing scope, the way a function sees its file's.
//! A parent naming its child is an edge, and so is every path between
//! siblings and cousins, through `super::`, `self::` or `crate::` alike.
//!
//! What it does not see: paths a macro builds and names a glob import
//! brings in (the glob itself is a reference to its module).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One token of Rust source: what the graph needs of it.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    PathSep,
    Punct(char),
}

/// Splits source into tokens with their line; comments and the content of
/// character literals and lifetimes are dropped.
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let count_lines = |from: usize, to: usize| c[from..to].iter().filter(|&&ch| ch == '\n').count();
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let (start, mut depth) = (i, 0usize);
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(start, i);
        } else if ch == '"' {
            let start = i;
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            let end = i.min(c.len());
            out.push((Tok::Str(c[start + 1..end - 1].iter().collect()), line));
            line += count_lines(start, end);
        } else if ch == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw_string = matches!(word.as_str(), "r" | "br" | "cr")
                && (c.get(i) == Some(&'"')
                    || (c.get(i) == Some(&'#') && {
                        let mut j = i;
                        while c.get(j) == Some(&'#') {
                            j += 1;
                        }
                        c.get(j) == Some(&'"')
                    }));
            if raw_string {
                let mut hashes = 0;
                while c.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                let body = i + 1;
                i = body;
                loop {
                    if i >= c.len() {
                        break;
                    }
                    if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                        break;
                    }
                    i += 1;
                }
                out.push((Tok::Str(c[body..i.min(c.len())].iter().collect()), line));
                line += count_lines(start, i.min(c.len()));
                i += 1 + hashes;
            } else if matches!(word.as_str(), "b" | "c") && matches!(c.get(i), Some('"' | '\'')) {
                // b"..", c"..", b'x': the next round reads the literal.
            } else if word == "r" && c.get(i) == Some(&'#') {
                // A raw identifier: r#type.
                i += 1;
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Where a reference was written.
#[derive(Debug, Clone)]
pub struct Site {
    pub file: PathBuf,
    pub line: usize,
    pub text: String,
}

/// One leaf of a `use` tree: its path, and the name it binds (none for a
/// glob or `as _`).
struct UseLeaf {
    path: Vec<String>,
    binds: Option<String>,
}

#[derive(Debug, Default)]
struct Module {
    name: String,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    bindings: BTreeMap<String, Vec<String>>,
    refs: Vec<(Vec<String>, Site)>,
}

/// The modules of one crate and the references between them.
#[derive(Debug, Default)]
pub struct Graph {
    modules: Vec<Module>,
}

fn ident(toks: &[(Tok, usize)], i: usize) -> Option<&str> {
    match toks.get(i) {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn is(toks: &[(Tok, usize)], i: usize, p: char) -> bool {
    matches!(toks.get(i), Some((Tok::Punct(q), _)) if *q == p)
}

/// Parses a `use` tree starting at `i` (after `use`) up to `;`; returns
/// its leaves and the index after the `;`.
fn use_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<UseLeaf>,
) -> usize {
    let mut path = prefix.to_vec();
    if i < toks.len() && toks[i].0 == Tok::PathSep {
        // `use ::x`: another crate.
        path.push("::".into());
        i += 1;
    }
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
                if toks.get(i).map(|t| &t.0) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                let mut binds = path.last().cloned();
                if ident(toks, i) == Some("as") {
                    binds = ident(toks, i + 1).filter(|a| *a != "_").map(str::to_owned);
                    i += 2;
                }
                if binds.as_deref() == Some("self") {
                    path.pop();
                    binds = path.last().cloned();
                }
                out.push(UseLeaf { path, binds });
                return i;
            }
            Some(Tok::Punct('*')) => {
                out.push(UseLeaf { path, binds: None });
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while i < toks.len() && !is(toks, i, '}') {
                    i = use_tree(toks, i, &path, out);
                    if is(toks, i, ',') {
                        i += 1;
                    }
                }
                return i + 1;
            }
            _ => return i,
        }
    }
}

impl Graph {
    /// Reads the crate whose root file is `root` (lib.rs, main.rs, a test
    /// or bench target).
    pub fn read(root: &Path) -> Result<Graph, String> {
        let mut graph = Graph {
            modules: vec![Module {
                name: "crate".into(),
                ..Module::default()
            }],
        };
        graph.read_file(
            0,
            root,
            root.parent().unwrap_or(Path::new(".")).to_path_buf(),
        )?;
        Ok(graph)
    }

    /// Reads `file` as the body of module `module`; `dir` is where its
    /// child modules' files are.
    fn read_file(&mut self, module: usize, file: &Path, dir: PathBuf) -> Result<(), String> {
        let src = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let toks = tokenize(&src);
        let here = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut scopes: Vec<(usize, usize, PathBuf)> = vec![(module, 0, dir)];
        let mut depth = 0usize;
        let mut pending: Option<(usize, PathBuf)> = None;
        let mut file_children = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            let (cur, _, cur_dir) = scopes.last().cloned().expect("the file's own scope");
            match &toks[i].0 {
                Tok::Punct('{') => {
                    depth += 1;
                    if let Some((m, d)) = pending.take() {
                        scopes.push((m, depth, d));
                    }
                    i += 1;
                }
                Tok::Punct('}') => {
                    if scopes.len() > 1 && scopes.last().is_some_and(|s| s.1 == depth) {
                        scopes.pop();
                    }
                    depth = depth.saturating_sub(1);
                    i += 1;
                }
                Tok::Ident(k) if k == "mod" && ident(&toks, i + 1).is_some() => {
                    let name = ident(&toks, i + 1).unwrap_or_default().to_owned();
                    let child = self.add(cur, &name);
                    if is(&toks, i + 2, ';') {
                        let file = match path_attr(&toks, i) {
                            Some(p) => here.join(p),
                            None => {
                                let flat = cur_dir.join(format!("{name}.rs"));
                                if flat.exists() {
                                    flat
                                } else {
                                    cur_dir.join(&name).join("mod.rs")
                                }
                            }
                        };
                        file_children.push((child, file));
                        i += 3;
                    } else {
                        pending = Some((child, cur_dir.join(&name)));
                        i += 2;
                    }
                }
                Tok::Ident(k) if k == "use" && !is(&toks, i + 1, '<') => {
                    let line = toks[i].1;
                    let mut leaves = Vec::new();
                    let end = use_tree(&toks, i + 1, &[], &mut leaves);
                    for leaf in leaves {
                        let text = format!("use {}", leaf.path.join("::"));
                        if let Some(b) = leaf.binds {
                            self.modules[cur].bindings.insert(b, leaf.path.clone());
                        }
                        self.modules[cur].refs.push((
                            leaf.path,
                            Site {
                                file: file.to_path_buf(),
                                line,
                                text,
                            },
                        ));
                    }
                    i = end.max(i + 1);
                }
                Tok::Ident(k) if k == "pub" && is(&toks, i + 1, '(') => {
                    while i < toks.len() && !is(&toks, i, ')') {
                        i += 1;
                    }
                }
                Tok::Ident(first)
                    if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                        && !matches!(
                            i.checked_sub(1).map(|p| &toks[p].0),
                            Some(Tok::PathSep | Tok::Punct('$' | '.'))
                        ) =>
                {
                    let line = toks[i].1;
                    let mut path = vec![first.clone()];
                    let mut j = i + 1;
                    while toks.get(j).map(|t| &t.0) == Some(&Tok::PathSep) {
                        match ident(&toks, j + 1) {
                            Some(s) => path.push(s.to_owned()),
                            None => break,
                        }
                        j += 2;
                    }
                    let text = path.join("::");
                    self.modules[cur].refs.push((
                        path,
                        Site {
                            file: file.to_path_buf(),
                            line,
                            text,
                        },
                    ));
                    i = j;
                }
                _ => i += 1,
            }
        }
        let child_dir = |file: &Path| -> PathBuf {
            let stem = file
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            let parent = file.parent().unwrap_or(Path::new(".")).to_path_buf();
            if stem == "mod" {
                parent
            } else {
                parent.join(stem)
            }
        };
        for (child, path) in file_children {
            let dir = child_dir(&path);
            self.read_file(child, &path, dir)?;
        }
        Ok(())
    }

    fn add(&mut self, parent: usize, name: &str) -> usize {
        let id = self.modules.len();
        self.modules.push(Module {
            name: name.to_owned(),
            parent: Some(parent),
            ..Module::default()
        });
        self.modules[parent].children.insert(name.to_owned(), id);
        id
    }

    /// `crate::a::b` for a module.
    pub fn name(&self, m: usize) -> String {
        let mut parts = vec![self.modules[m].name.clone()];
        let mut cur = self.modules[m].parent;
        while let Some(p) = cur {
            parts.push(self.modules[p].name.clone());
            cur = self.modules[p].parent;
        }
        parts.reverse();
        parts.join("::")
    }

    /// The module a path written in `m` starts from, and the rest of the
    /// path; `None` for another crate (or a local name the graph does not
    /// know).
    fn start(&self, m: usize, path: &[String], fuel: usize) -> Option<(usize, Vec<String>)> {
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some((0, path[1..].to_vec())),
            "self" => Some((m, path[1..].to_vec())),
            "super" => {
                let mut at = self.modules[m].parent?;
                let mut rest = &path[1..];
                while rest.first().map(String::as_str) == Some("super") {
                    at = self.modules[at].parent?;
                    rest = &rest[1..];
                }
                Some((at, rest.to_vec()))
            }
            name => {
                if let Some(&c) = self.modules[m].children.get(name) {
                    return Some((c, path[1..].to_vec()));
                }
                let bound = self.modules[m].bindings.get(name)?;
                if fuel == 0 || bound.len() == 1 && bound[0] == *name {
                    return None;
                }
                let (at, mut rest) = self.start(m, bound, fuel - 1)?;
                rest.extend_from_slice(&path[1..]);
                Some((at, rest))
            }
        }
    }

    /// The deepest module a path written in `m` names, following re-exports.
    fn resolve(&self, m: usize, path: &[String], fuel: usize) -> Option<usize> {
        let (mut at, rest) = self.start(m, path, fuel)?;
        for (k, seg) in rest.iter().enumerate() {
            if let Some(&c) = self.modules[at].children.get(seg) {
                at = c;
            } else if let Some(bound) = self.modules[at].bindings.get(seg).filter(|_| fuel > 0) {
                let mut via = bound.clone();
                via.extend_from_slice(&rest[k + 1..]);
                // A re-export of another crate's item stays where it is.
                return Some(self.resolve(at, &via, fuel - 1).unwrap_or(at));
            } else {
                break;
            }
        }
        Some(at)
    }

    /// Every edge `from -> to` between two different modules, with the
    /// first place it was written.
    pub fn edges(&self) -> BTreeMap<(usize, usize), Site> {
        let mut edges = BTreeMap::new();
        for (m, module) in self.modules.iter().enumerate() {
            for (path, site) in &module.refs {
                if let Some(to) = self
                    .resolve(m, path, 16)
                    .filter(|&to| to != m && !self.encloses(to, m))
                {
                    edges.entry((m, to)).or_insert_with(|| site.clone());
                }
            }
        }
        edges
    }

    /// Every cycle, one per strongly connected component of more than one
    /// module, as a readable chain of edges with where each is written.
    pub fn cycles(&self) -> Vec<String> {
        let edges = self.edges();
        let mut next: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        for &(a, b) in edges.keys() {
            next.entry(a).or_default().insert(b);
        }
        let mut out = Vec::new();
        for scc in components(self.modules.len(), &next) {
            if scc.len() < 2 {
                continue;
            }
            let members: BTreeSet<usize> = scc.iter().copied().collect();
            let start = scc[0];
            let chain = shortest_cycle(start, &members, &next);
            let names: Vec<String> = scc.iter().map(|&m| self.name(m)).collect();
            let mut text = format!("cycle among {{{}}}:\n", names.join(", "));
            for w in chain.windows(2) {
                let site = &edges[&(w[0], w[1])];
                let _ = writeln!(
                    text,
                    "  {} -> {}   ({}:{}: {})",
                    self.name(w[0]),
                    self.name(w[1]),
                    site.file.display(),
                    site.line,
                    site.text
                );
            }
            out.push(text);
        }
        out
    }

    /// Whether `outer` is one of the modules `m` is declared in.
    fn encloses(&self, outer: usize, m: usize) -> bool {
        let mut cur = self.modules[m].parent;
        while let Some(p) = cur {
            if p == outer {
                return true;
            }
            cur = self.modules[p].parent;
        }
        false
    }
}

/// The attribute `#[path = ".."]` among those in front of the `mod` at `i`.
fn path_attr(toks: &[(Tok, usize)], i: usize) -> Option<String> {
    let mut j = i;
    // Skip the visibility.
    while j > 0 && (ident(toks, j - 1) == Some("pub") || is(toks, j - 1, ')')) {
        if is(toks, j - 1, ')') {
            while j > 0 && !is(toks, j - 1, '(') {
                j -= 1;
            }
            j -= 1;
        } else {
            j -= 1;
        }
    }
    while j > 0 && is(toks, j - 1, ']') {
        let end = j - 1;
        let mut open = end;
        let mut depth = 0;
        loop {
            if is(toks, open, ']') {
                depth += 1;
            } else if is(toks, open, '[') {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            if open == 0 {
                return None;
            }
            open -= 1;
        }
        if ident(toks, open + 1) == Some("path")
            && is(toks, open + 2, '=')
            && let Some((Tok::Str(p), _)) = toks.get(open + 3)
        {
            return Some(p.clone());
        }
        j = open.checked_sub(1)?;
        if !is(toks, j, '#') {
            return None;
        }
    }
    None
}

/// Tarjan's strongly connected components.
fn components(n: usize, next: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    struct State<'a> {
        next: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.next.get(&v).into_iter().flatten() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            scc.sort_unstable();
            s.out.push(scc);
        }
    }
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The shortest path from `start` back to itself inside one component.
fn shortest_cycle(
    start: usize,
    members: &BTreeSet<usize>,
    next: &BTreeMap<usize, BTreeSet<usize>>,
) -> Vec<usize> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in next
            .get(&v)
            .into_iter()
            .flatten()
            .filter(|w| members.contains(w))
        {
            if w == start {
                let mut chain = vec![start, v];
                let mut at = v;
                while at != start {
                    at = came_from[&at];
                    chain.push(at);
                }
                chain.reverse();
                return chain;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    vec![start]
}
