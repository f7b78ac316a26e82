module github.com/edgegate/edgegate

go 1.26.0
