//! Test support (feature `testing`): lay files out the way the kubelet updates a Secret
//! volume, so tests rotate certificates exactly as a cluster does.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a panic is the failure report

use std::path::{Path, PathBuf};

/// A directory kept like a mounted Secret: the files live in a timestamped directory,
/// `..data` points at it, and each top-level name is a symlink through `..data`.
pub struct KubeletVolume {
    pub dir: PathBuf,
    generation: u32,
}

impl KubeletVolume {
    /// Lays out `files` (name, contents) in `dir`.
    pub fn new(dir: &Path, files: &[(&str, &[u8])]) -> Self {
        let mut v = Self { dir: dir.to_path_buf(), generation: 0 };
        v.rotate(files);
        v
    }

    /// Writes a new timestamped directory, points `..data_tmp` at it, renames it over
    /// `..data`, removes the old directory, then adds the top-level symlink of each new key and
    /// removes those of keys gone: the kubelet's atomic writer.
    pub fn rotate(&mut self, files: &[(&str, &[u8])]) {
        let before: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".."))
            .collect();
        self.generation += 1;
        let ts = format!("..2026_11_30_08_00_00.{:09}", self.generation);
        let new = self.dir.join(&ts);
        std::fs::create_dir(&new).unwrap();
        for (name, contents) in files {
            std::fs::write(new.join(name), contents).unwrap();
        }
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        std::os::unix::fs::symlink(&ts, self.dir.join("..data_tmp")).unwrap();
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
        for (name, _) in files {
            if !before.iter().any(|b| b == name) {
                std::os::unix::fs::symlink(format!("..data/{name}"), self.dir.join(name)).unwrap();
            }
        }
        for gone in before.iter().filter(|b| !files.iter().any(|(name, _)| name == b)) {
            std::fs::remove_file(self.dir.join(gone)).unwrap();
        }
    }
}
