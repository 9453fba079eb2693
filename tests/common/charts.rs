//! Checks of `flightdeck report`'s output: the files a report links exist, and each PNG is a
//! chart with real content (not a blank canvas).
use std::path::Path;

/// The font the charts need; without it the report says why instead of drawing.
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

pub fn have_font() -> bool {
    Path::new(FONT).exists()
}

/// The files a markdown text links to (`![..](X)` and `[SVG](X)`).
pub fn links(md: &str) -> Vec<String> {
    md.split("](").skip(1).filter_map(|rest| rest.split(')').next()).map(str::to_string).collect()
}

/// Checks every linked file exists and every PNG is a 960×420 chart with real content;
/// returns the linked file names.
pub fn check_images(dir: &Path, md: &str) -> Vec<String> {
    let files = links(md);
    assert!(!files.is_empty(), "no charts linked:\n{md}");
    for f in &files {
        let path = dir.join(f);
        assert!(path.is_file(), "{f} is linked but missing");
        if f.ends_with(".png") {
            let img = image::open(&path).unwrap_or_else(|e| panic!("{f}: {e}")).to_rgb8();
            assert_eq!(img.dimensions(), (960, 420), "{f}");
            let lum: Vec<f64> = img.pixels().map(|p| f64::from(p[0]) + f64::from(p[1]) + f64::from(p[2])).collect();
            let mean = lum.iter().sum::<f64>() / lum.len() as f64;
            let var = lum.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / lum.len() as f64;
            let dark = lum.iter().filter(|&&l| l < 600.0).count();
            assert!(var > 100.0 && dark > 2_000, "{f} looks blank: variance {var:.1}, {dark} drawn pixels");
        }
    }
    files
}
